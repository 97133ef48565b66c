// cuDNN's fused SDPA (the single-operation SDPA_FWD / SDPA_BWD nodes of the cuDNN 9 backend
// graph API, no frontend headers) for attention blocks without a causal mask: the
// off-diagonal steps of a ring, which carry most of its FLOPs. cuDNN 9.19 has no causal
// or offset mask on these nodes, so causal blocks stay on kernels/attention_*.cu.
// Forward emits o and the fp32 natural-log LSE ("Stats", [B, H, Sq, 1]); backward writes
// dq/dk/dv into scratch, which the backend adds into the accumulating gradients.
// Execution plans are built once per shape and cached. A shape cuDNN declines is
// remembered and reported through try_* returning false (the caller falls back).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

namespace easyctx::ops::cuda {

struct SdpaShape {
  int64_t b, sq, sk, hq, hkv, hd;
  auto key() const { return std::tie(b, sq, sk, hq, hkv, hd); }
};

class CudnnAttention {
 public:
  CudnnAttention();  // throws if cuDNN cannot create a handle
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Layouts as ops::Backend::attention_fwd ([B, S, H, hd] bf16, lse f32[B, H, Sq]).
  // false: cuDNN has no plan for this shape (nothing was written).
  bool try_fwd(const SdpaShape& s, float scale, const void* q, const void* k, const void* v, void* o, float* lse,
               cudaStream_t st);
  // Whether cuDNN has a forward plan for the shape (built and cached on first ask).
  bool has_fwd_plan(const SdpaShape& s);
  // Whether cuDNN has a backward plan for the shape (built and cached on first ask), so the
  // caller allocates gradient scratch only when it will be used.
  bool has_bwd_plan(const SdpaShape& s);
  // Writes (overwrites) dq, dk, dv.
  bool try_bwd(const SdpaShape& s, float scale, const void* q, const void* k, const void* v, const void* o,
               const float* lse, const void* dout, void* dq, void* dk, void* dv, cudaStream_t st);
  // Why the last declined shape was declined (for logs and the bench).
  const std::string& last_decline() const { return last_decline_; }
  // Bytes of the execution workspace (cudaMalloc, grown to the largest plan's need).
  size_t workspace_bytes() const { return ws_bytes_; }

 private:
  struct Plan;
  Plan* plan(bool bwd, const SdpaShape& s);
  void* workspace(size_t bytes, cudaStream_t st);

  void* handle_ = nullptr;  // cudnnHandle_t
  std::map<std::tuple<bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>, std::unique_ptr<Plan>> plans_;
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  std::string last_decline_;
};

}  // namespace easyctx::ops::cuda
