// Fused AdamW (PyTorch semantics) on fp32 master weights: p, g, m, v f32[n].
//   m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p = p (1 - lr wd) - lr (m/bc1) / (sqrt(v/bc2) + eps)
//   bytes: 7 n * 4 (read p g m v, write p m v); ~15 n FLOPs + n sqrt
#include "common.cuh"
#include "kernels.h"

namespace easyctx::kernels {
namespace {

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                             float beta2, float eps, float decay, float bc1, float bc2) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = g[i];
    const float mi = beta1 * m[i] + (1.f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
  }
}

}  // namespace

void adamw(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
           float decay, float bc1, float bc2, cudaStream_t st) {
  if (n == 0) return;
  adamw_kernel<<<elementwise_grid(n, 256), 256, 0, st>>>(p, g, m, v, n, lr, beta1, beta2, eps, decay, bc1, bc2);
  EASYCTX_CUDA_CHECK_LAUNCH("adamw_kernel");
}

}  // namespace easyctx::kernels
