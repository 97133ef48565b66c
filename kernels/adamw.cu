// Fused AdamW (PyTorch semantics) on fp32 master weights: p, g, m, v f32[n].
//   m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p = p (1 - lr wd) - lr (m/bc1) / (sqrt(v/bc2) + eps)
//   (the element update is adamw_math.h's, bit-identical to the host optimizer's)
//   bytes: 7 n * 4 (read p g m v, write p m v); ~15 n FLOPs + n sqrt
#include "kernels/common.cuh"
#include "kernels/adamw_math.h"
#include "kernels/kernels.h"

namespace easyctx::kernels {
namespace {

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, AdamWConsts c) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_element(pi, g[i], mi, vi, c);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWConsts& c, cudaStream_t st) {
  if (n == 0) return;
  adamw_kernel<<<elementwise_grid(n, 256), 256, 0, st>>>(p, g, m, v, n, c);
  EASYCTX_CUDA_CHECK_LAUNCH("adamw_kernel");
}

}  // namespace easyctx::kernels
