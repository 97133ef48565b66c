// RMSNorm (HF): y = w * x * rstd, rstd = 1/sqrt(mean(x^2) + eps); x, y [n, D], w [D], rstd f32[n].
//   fwd: one block per row.            bytes: 2 n D sizeof(T) + D sizeof(T) + 4n; ~4 n D FLOPs
//   bwd dx (accumulates): one block per row, dot = sum_k w dy x, dx += rstd w dy - dot rstd^3/D x
//                                      bytes: 4 n D sizeof(T); ~8 n D FLOPs
//   bwd dw: per chunk of kDwRows rows a column sum of dy x rstd into f32 partial[chunks, D],
//   then one ordered pass over the chunks adds into dw (no atomics: deterministic).
#include "common.cuh"
#include "kernels.h"

namespace easyctx::kernels {
namespace {

constexpr int64_t kDwRows = 64;

template <typename T>
__global__ void rmsnorm_fwd_kernel(const T* x, const T* w, int64_t d, float eps, T* y, float* rstd) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * d;
  float ss = 0;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    const float v = to_float(xr[c]);
    ss += v * v;
  }
  ss = block_sum(ss);
  const float r = rsqrtf(ss / static_cast<float>(d) + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  T* yr = y + row * d;
  // Round x*r to the storage type before the weight, as the reference (and HF) do.
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
    yr[c] = from_float<T>(to_float(w[c]) * to_float(from_float<T>(to_float(xr[c]) * r)));
}

template <typename T>
__global__ void rmsnorm_bwd_dx_kernel(const T* x, const T* w, const float* rstd, const T* dy, int64_t d, T* dx) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * d;
  const T* gr = dy + row * d;
  float dot = 0;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) dot += to_float(w[c]) * to_float(gr[c]) * to_float(xr[c]);
  dot = block_sum(dot);
  const float r = rstd[row];
  const float k = dot * r * r * r / static_cast<float>(d);
  T* dxr = dx + row * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
    dxr[c] = from_float<T>(to_float(dxr[c]) + r * to_float(w[c]) * to_float(gr[c]) - k * to_float(xr[c]));
}

template <typename T>
__global__ void rmsnorm_bwd_dw_partial_kernel(const T* x, const float* rstd, const T* dy, int64_t n, int64_t d,
                                              float* partial) {
  const int64_t c = blockIdx.y * int64_t(blockDim.x) + threadIdx.x;
  if (c >= d) return;
  const int64_t r0 = blockIdx.x * kDwRows, r1 = min(n, r0 + kDwRows);
  float acc = 0;
  for (int64_t r = r0; r < r1; ++r) acc += to_float(dy[r * d + c]) * to_float(x[r * d + c]) * rstd[r];
  partial[blockIdx.x * d + c] = acc;
}

template <typename T>
__global__ void reduce_columns_add_kernel(const float* partial, int64_t chunks, int64_t d, T* dw) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= d) return;
  float acc = 0;
  for (int64_t k = 0; k < chunks; ++k) acc += partial[k * d + c];
  dw[c] = from_float<T>(to_float(dw[c]) + acc);
}

}  // namespace

int64_t rmsnorm_dw_chunks(int64_t n) { return CEIL_DIV(n, kDwRows); }

template <typename T>
void rmsnorm_fwd(const T* x, const T* w, int64_t n, int64_t d, float eps, T* y, float* rstd, cudaStream_t st) {
  if (n == 0) return;
  rmsnorm_fwd_kernel<<<static_cast<unsigned>(n), 256, 0, st>>>(x, w, d, eps, y, rstd);
  EASYCTX_CUDA_CHECK_LAUNCH("rmsnorm_fwd_kernel");
}

template <typename T>
void rmsnorm_bwd(const T* x, const T* w, const float* rstd, const T* dy, int64_t n, int64_t d, T* dx,
                 float* partial_dw, cudaStream_t st) {
  if (n == 0) return;
  rmsnorm_bwd_dx_kernel<<<static_cast<unsigned>(n), 256, 0, st>>>(x, w, rstd, dy, d, dx);
  EASYCTX_CUDA_CHECK_LAUNCH("rmsnorm_bwd_dx_kernel");
  if (partial_dw) {
    dim3 grid(static_cast<unsigned>(rmsnorm_dw_chunks(n)), static_cast<unsigned>(CEIL_DIV(d, 256)));
    rmsnorm_bwd_dw_partial_kernel<<<grid, 256, 0, st>>>(x, rstd, dy, n, d, partial_dw);
    EASYCTX_CUDA_CHECK_LAUNCH("rmsnorm_bwd_dw_partial_kernel");
  }
}

template <typename T>
void reduce_columns_add(const float* partial, int64_t chunks, int64_t d, T* dw, cudaStream_t st) {
  reduce_columns_add_kernel<<<static_cast<unsigned>(CEIL_DIV(d, 256)), 256, 0, st>>>(partial, chunks, d, dw);
  EASYCTX_CUDA_CHECK_LAUNCH("reduce_columns_add_kernel");
}

#define INST(T)                                                                                                   \
  template void rmsnorm_fwd<T>(const T*, const T*, int64_t, int64_t, float, T*, float*, cudaStream_t);            \
  template void rmsnorm_bwd<T>(const T*, const T*, const float*, const T*, int64_t, int64_t, T*, float*,          \
                               cudaStream_t);                                                                     \
  template void reduce_columns_add<T>(const float*, int64_t, int64_t, T*, cudaStream_t);
INST(float)
INST(bf16)
#undef INST

}  // namespace easyctx::kernels
