// The CUDA backend of the ops interface: device memory, bf16 storage with fp32 arithmetic
// (fp32 tensors where the interface asks: statistics, master weights, Adam states), one
// stream per backend, matmuls through cuBLASLt, attention through cuDNN's fused SDPA graphs
// (lib/ops/cuda/cudnn_attention.h) with the FlashAttention-2 style kernels in kernels/ as the
// fallback. Every CUDA/cuBLAS/cuDNN error throws easyctx::Error with context.
// Built only when CMake finds CUDA (EASYCTX_HAVE_CUDA); see docs/cuda.md.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>

#include "ops/ops.h"
#include "ops/scratch.h"

namespace easyctx::ops {

struct CudaBackendOptions {
  int device = -1;                                                       // -1: the calling thread's current device
  cudaStream_t stream = nullptr;                                         // nullptr: the backend creates (and owns) one
  size_t cublas_workspace = static_cast<size_t>(kCublasWorkspaceBytes);  // bytes (ops/scratch.h)
  // Attention through cuDNN (>= 9.19) where it has a plan for the shape: forward of blocks
  // without a mask (ring off-diagonal steps, the key prefixes of causal squares), backward
  // of those and of causal squares (the composite flash backward graph); otherwise the
  // FlashAttention-2 style kernels of kernels/attention_*.cu.
  bool cudnn_attention = true;
  // Causal squares' forward in one call of cuDNN's composite causal graph; false: in query
  // chunks (key prefix through cuDNN, diagonal through the kernel, LSE merge), the path
  // taken when cuDNN declines the graph (tests reach it with false).
  bool cudnn_causal_graph = true;
  // On an sm_90 device (H100/H200): the attention forward and backward through easyctx's
  // Hopper kernels (kernels/attention_fwd_sm90.cu, attention_bwd_sm90.cu) where the router
  // puts them (ops/attention_route.h: before cuDNN where they measured faster,
  // ops::sm90_before_cudnn / sm90_bwd_before_cudnn; in place of the FA2 kernels otherwise);
  // ignored on other devices. train.hopper_attention.
  bool sm90_attention = true;
  // Bit-identical reruns: the attention backward adds dQ in a fixed order (the Hopper kernel's
  // deterministic variant, or cuDNN's deterministic graph: dP in its workspace, so smaller
  // tiles). false: atomic dQ accumulation (cuDNN's atomic backward first), faster.
  bool deterministic = true;
  // Rows/columns of the tiles larger attention backward blocks run in (0: ops::attention_bwd_tile);
  // tests lower it to reach the tiled path with short sequences.
  int64_t attention_bwd_tile = 0;
};

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& opts = {});

// The stream a CUDA backend queues its work on (throws for other backends).
cudaStream_t cuda_stream(Backend& b);

// Which path the last attention call of a CUDA backend took ("kernel" or "cudnn") and, if
// cuDNN declined a shape, why (for benchmarks and logs).
std::string cuda_attention_path(Backend& b);

// Number of visible CUDA devices; 0 (never an error) when there is no driver or device,
// so tests can skip.
int cuda_device_count();

}  // namespace easyctx::ops
