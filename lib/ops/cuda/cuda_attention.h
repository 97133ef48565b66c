// The CUDA backend's attention (attention_fwd, attention_bwd): checks a call like the CPU
// reference, asks the router (ops/attention_route.h) for its routes and runs the first that
// applies: cuDNN's fused graphs (lib/ops/cuda/cudnn_attention.h) where cuDNN takes the shape
// and the buffers are 16-byte aligned, else the next route, the FlashAttention-2 style
// kernels of kernels/attention_*.cu last. Its scratch is sized by the router's functions.
// Owned by the CUDA backend (cuda_backend.cpp), which delegates to it; see docs/cuda.md.
#pragma once
#include <cuda_runtime.h>

#include <initializer_list>
#include <memory>
#include <string>

#include "kernels/attention.h"
#include "ops/attention_route.h"
#include "ops/memory_counter.h"
#include "ops/ops.h"

namespace easyctx::ops::cuda {

class CudnnAttention;

// The kernels' view of a call on contiguous bf16 q, k, v [B, S, H, hd] (shapes, row and batch
// strides, scale, causal diagonal; the output and gradient pointers left for the caller),
// checked as the backend checks it (`op` names the call in errors). The backend's routes and
// bench_attention's direct calls of the Hopper kernels build their parameters here.
kernels::AttentionParams attention_params(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                          const AttentionBlock& blk);

class CudaAttention {
 public:
  // backend: the backend that owns this one (its fill, copy and attention_merge run the
  // parts that are not attention); stream: its stream; mem: its live-byte counter, which
  // also counts cuDNN's workspace as it grows.
  CudaAttention(Backend& backend, cudaStream_t stream, std::shared_ptr<MemoryCounter> mem,
                const AttentionRouteOptions& opts);
  ~CudaAttention();
  CudaAttention(const CudaAttention&) = delete;
  CudaAttention& operator=(const CudaAttention&) = delete;

  // Backend::attention_fwd / attention_bwd (same arguments, same contract).
  void forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionBlock& blk, const Tensor& o,
               const Tensor& lse);
  void backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                const Tensor& dout, const AttentionBlock& blk, const Tensor& dq, const Tensor& dk, const Tensor& dv);

  // The options the routes are chosen with (cudnn turns false if cuDNN cannot start).
  const AttentionRouteOptions& options() const { return opts_; }
  // The route's name for a call (Backend::attention_route).
  std::string route(const AttentionCall& c, bool backward) const;
  // What the last call ran ("kernel", "cudnn (causal graph)", "cudnn (2 x 2 tiles of 1024)",
  // ...) and, if cuDNN declined a shape, why (ops::cuda_attention_path).
  std::string path() const;

 private:
  // Routes; each returns false, with nothing written, where cuDNN declines or a buffer is
  // not 16-byte aligned.
  bool causal_square_cudnn(const kernels::AttentionParams& p);
  bool causal_in_chunks(const kernels::AttentionParams& p, const AttentionCall& c);
  bool unmasked_cudnn(const kernels::AttentionParams& p);
  bool cudnn_bwd_in_place(const kernels::AttentionParams& p, const AttentionCall& c, const Tensor& dq, const Tensor& dk,
                          const Tensor& dv);
  bool cudnn_bwd_one_call(const kernels::AttentionParams& p, const AttentionCall& c, const Tensor& dq, const Tensor& dk,
                          const Tensor& dv);
  bool cudnn_bwd_tiles(const kernels::AttentionParams& p, const AttentionCall& c, const Tensor& dq, const Tensor& dk,
                       const Tensor& dv);
  void kernel_bwd(kernels::AttentionParams& p, const AttentionCall& c, const Tensor& dq, const Tensor& dk,
                  const Tensor& dv);
  // The Hopper backward kernel; false (nothing written) where it cannot take the call (a layout
  // TMA cannot load).
  bool sm90_bwd(kernels::AttentionParams& p, const AttentionCall& c, const Tensor& dq, const Tensor& dk,
                const Tensor& dv);

  // Runs `run`, a kernel that adds into p.dq / p.dk / p.dv in bf16, for the gradients dq, dk, dv:
  // bf16 ones directly; f32 ones (a ring's accumulators) through zeroed bf16 scratch of
  // `grads_bytes` (AttentionBwdScratch::grads), then added in fp32, so rounding does not compound
  // across ring steps. `run` allocates its own scratch after that one, as the plan lists them.
  template <typename Run>
  void into_gradients(kernels::AttentionParams& p, const AttentionCall& c, int64_t grads_bytes, const Tensor& dq,
                      const Tensor& dk, const Tensor& dv, const Run& run);
  // dst[offset .. offset + n) += x (bf16 or f32), dst bf16 or f32 (rounded once, from fp32).
  template <typename TX>
  void add_into(const Tensor& dst, int64_t offset, const TX* x, int64_t n);
  // cuDNN's tensors are declared 16-byte aligned.
  static bool aligned16(std::initializer_list<const void*> ptrs);
  // The cuDNN SDPA runner, made on first use; nullptr (and cuDNN off) if cuDNN cannot start.
  CudnnAttention* cudnn();
  // Passes `ok` through after counting growth of the cuDNN workspace in the live bytes.
  bool after_cudnn(bool ok);
  void note_decline();

  Backend& be_;
  cudaStream_t stream_;
  std::shared_ptr<MemoryCounter> mem_;
  AttentionRouteOptions opts_;
  std::unique_ptr<CudnnAttention> cudnn_;
  std::string last_path_ = "none", cudnn_decline_;
  int64_t cudnn_ws_counted_ = 0;  // cuDNN workspace counted so far (it only grows)
};

}  // namespace easyctx::ops::cuda
