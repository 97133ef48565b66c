// SwiGLU: h = silu(g) * u on g, u, h [n] (n = tokens * intermediate).
//   fwd: bytes 3n sizeof(T), ~5n FLOPs + n exp
//   bwd: du = dh g s, dg = dh u s (1 + g (1 - s)), s = sigmoid(g); bytes 5n sizeof(T)
// Grid-stride loops over groups of 8 elements (16-byte loads and stores) when the pointers
// are 16-byte aligned, the rest element by element.
#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace easyctx::kernels {
namespace {

__device__ __forceinline__ float silu_mul(float g, float u) { return g * (1.f / (1.f + expf(-g))) * u; }
__device__ __forceinline__ void swiglu_grad(float g, float u, float d, float& dg, float& du) {
  const float s = 1.f / (1.f + expf(-g));
  du = d * g * s;
  dg = d * u * s * (1.f + g * (1.f - s));
}

// vec: every pointer 16-byte aligned (for_each_by8); the same formula per element on both paths.
template <typename T>
__global__ void swiglu_fwd_kernel(const T* g, const T* u, int64_t n, T* h, bool vec) {
  for_each_by8(
      n, vec,
      [&](int64_t i) {
        float a[8], b[8];
        load8(g + i, a);
        load8(u + i, b);
#pragma unroll
        for (int k = 0; k < 8; ++k) a[k] = silu_mul(a[k], b[k]);
        store8(h + i, a);
      },
      [&](int64_t i) { h[i] = from_float<T>(silu_mul(to_float(g[i]), to_float(u[i]))); });
}

template <typename T>
__global__ void swiglu_bwd_kernel(const T* g, const T* u, const T* dh, int64_t n, T* dg, T* du, bool vec) {
  for_each_by8(
      n, vec,
      [&](int64_t i) {
        float a[8], b[8], d[8];
        load8(g + i, a);
        load8(u + i, b);
        load8(dh + i, d);
#pragma unroll
        for (int k = 0; k < 8; ++k) swiglu_grad(a[k], b[k], d[k], a[k], b[k]);
        store8(dg + i, a);
        store8(du + i, b);
      },
      [&](int64_t i) {
        float a, b;
        swiglu_grad(to_float(g[i]), to_float(u[i]), to_float(dh[i]), a, b);
        dg[i] = from_float<T>(a);
        du[i] = from_float<T>(b);
      });
}

}  // namespace

template <typename T>
void swiglu_fwd(const T* g, const T* u, int64_t n, T* h, cudaStream_t st) {
  if (n == 0) return;
  const bool vec = aligned16(g) && aligned16(u) && aligned16(h);
  swiglu_fwd_kernel<<<vec_grid(n, vec, 256), 256, 0, st>>>(g, u, n, h, vec);
  EASYCTX_CUDA_CHECK_LAUNCH("swiglu_fwd_kernel");
}

template <typename T>
void swiglu_bwd(const T* g, const T* u, const T* dh, int64_t n, T* dg, T* du, cudaStream_t st) {
  if (n == 0) return;
  const bool vec = aligned16(g) && aligned16(u) && aligned16(dh) && aligned16(dg) && aligned16(du);
  swiglu_bwd_kernel<<<vec_grid(n, vec, 256), 256, 0, st>>>(g, u, dh, n, dg, du, vec);
  EASYCTX_CUDA_CHECK_LAUNCH("swiglu_bwd_kernel");
}

template void swiglu_fwd<float>(const float*, const float*, int64_t, float*, cudaStream_t);
template void swiglu_fwd<bf16>(const bf16*, const bf16*, int64_t, bf16*, cudaStream_t);
template void swiglu_bwd<float>(const float*, const float*, const float*, int64_t, float*, float*, cudaStream_t);
template void swiglu_bwd<bf16>(const bf16*, const bf16*, const bf16*, int64_t, bf16*, bf16*, cudaStream_t);

}  // namespace easyctx::kernels
