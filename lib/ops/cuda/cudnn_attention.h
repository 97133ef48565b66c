// cuDNN's fused SDPA through the cuDNN 9 backend graph API (no frontend headers):
//  - forward: the single-operation SDPA_FWD node for blocks without a mask (cuDNN 9.19 has
//    no mask on it): a ring's off-diagonal steps; causal squares (one GPU's sequence, a
//    ring's step 0) through the composite graph cudnn-frontend lowers a causal sdpa to
//    (matmul, scale, top-left causal mask, max/sub/exp/sum/log softmax with Stats, matmul);
//  - backward: the composite graph cudnn-frontend builds for sdpa_backward on Ampere and
//    Hopper (matmuls, pointwise ops, reductions and reshapes that cuDNN fuses into one
//    flash-attention backward kernel), with or without a top-left causal mask (a causal
//    square: key j visible to query i iff j <= i), native GQA, and the caller's final output
//    and LSE (a ring's merged ones), whose rows may be strided (a chunk of a longer
//    sequence); the single-operation SDPA_BWD node (Blackwell) is the fallback.
// Forward emits o and the fp32 natural-log LSE ("Stats", [B, H, Sq, 1]); backward
// overwrites dq/dk/dv (the backend adds them into its accumulating gradients). The
// composite backward keeps softmax_sum f32[B, Hq, Sq] and, unless deterministic, dQ_accum
// f32[B, Hq, Sq, hd] (summed into atomically across key tiles, so the last bits of dQ vary
// between runs) in the workspace after cuDNN's own; the deterministic variant (cudnn-frontend's
// "dP workspace" graph) has cuDNN keep dP, bf16[B, Hq, Sq, Sk], in its workspace instead.
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
  bool causal = false;         // top-left causal mask (key j visible to query i iff j <= i)
  int64_t lse_stride = 0;      // elements between heads of the LSE rows (0: sq, packed)
  bool deterministic = false;  // backward: dS in the workspace, no atomic dQ accumulation
  auto key() const { return std::tie(b, sq, sk, hq, hkv, hd, causal, lse_stride, deterministic); }
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
  std::map<std::tuple<bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, int64_t, bool>,
           std::unique_ptr<Plan>>
      plans_;
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  std::string last_decline_;
};

}  // namespace easyctx::ops::cuda
