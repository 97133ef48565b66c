// SwiGLU: h = silu(g) * u on g, u, h [n] (n = tokens * intermediate).
//   fwd: bytes 3n sizeof(T), ~5n FLOPs + n exp
//   bwd: du = dh g s, dg = dh u s (1 + g (1 - s)), s = sigmoid(g); bytes 5n sizeof(T)
#include "common.cuh"
#include "kernels.h"

namespace easyctx::kernels {
namespace {

template <typename T>
__global__ void swiglu_fwd_kernel(const T* g, const T* u, int64_t n, T* h) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = to_float(g[i]);
    const float s = 1.f / (1.f + expf(-gi));
    h[i] = from_float<T>(gi * s * to_float(u[i]));
  }
}

template <typename T>
__global__ void swiglu_bwd_kernel(const T* g, const T* u, const T* dh, int64_t n, T* dg, T* du) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = to_float(g[i]), ui = to_float(u[i]), d = to_float(dh[i]);
    const float s = 1.f / (1.f + expf(-gi));
    du[i] = from_float<T>(d * gi * s);
    dg[i] = from_float<T>(d * ui * s * (1.f + gi * (1.f - s)));
  }
}

}  // namespace

template <typename T>
void swiglu_fwd(const T* g, const T* u, int64_t n, T* h, cudaStream_t st) {
  if (n == 0) return;
  swiglu_fwd_kernel<<<elementwise_grid(n, 256), 256, 0, st>>>(g, u, n, h);
  EASYCTX_CUDA_CHECK_LAUNCH("swiglu_fwd_kernel");
}

template <typename T>
void swiglu_bwd(const T* g, const T* u, const T* dh, int64_t n, T* dg, T* du, cudaStream_t st) {
  if (n == 0) return;
  swiglu_bwd_kernel<<<elementwise_grid(n, 256), 256, 0, st>>>(g, u, dh, n, dg, du);
  EASYCTX_CUDA_CHECK_LAUNCH("swiglu_bwd_kernel");
}

template void swiglu_fwd<float>(const float*, const float*, int64_t, float*, cudaStream_t);
template void swiglu_fwd<bf16>(const bf16*, const bf16*, int64_t, bf16*, cudaStream_t);
template void swiglu_bwd<float>(const float*, const float*, const float*, int64_t, float*, float*, cudaStream_t);
template void swiglu_bwd<bf16>(const bf16*, const bf16*, const bf16*, int64_t, bf16*, bf16*, cudaStream_t);

}  // namespace easyctx::kernels
