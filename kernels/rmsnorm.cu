// RMSNorm (HF): y = w * x * rstd, rstd = 1/sqrt(mean(x^2) + eps); x, y [n, D], w [D], rstd f32[n].
//   fwd: one block per row.            bytes: 2 n D sizeof(T) + D sizeof(T) + 4n; ~4 n D FLOPs
//   bwd dx (accumulates): one block per row, dot = sum_k w dy x, dx += rstd w dy - dot rstd^3/D x
//                                      bytes: 4 n D sizeof(T); ~8 n D FLOPs
//   bwd dw: per chunk of kDwRows rows a column sum of dy x rstd into f32 partial[chunks, D],
//   then one ordered pass over the chunks adds into dw (no atomics: deterministic).
// Vector path (D a multiple of 8 up to kVecMaxD, 16-byte aligned pointers): 256 threads per
// row (fwd) or per chunk of rows (bwd), each holding its 8-element groups of the row in
// registers, so x and dy are read from memory once; the bwd computes dx and the chunk's dw
// partial in one pass (4 n D sizeof(T) bytes instead of 6). Otherwise the scalar kernels.
#include <initializer_list>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace easyctx::kernels {
namespace {

constexpr int64_t kDwRows = ops::kRmsnormDwRows;

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

constexpr int kVecThreads = 256;
constexpr int64_t kVecMaxD = 4 * 8 * kVecThreads;  // up to 4 groups of 8 per thread

// G = groups of 8 per thread (ceil(D / 8 / 256)).
template <typename T, int G>
__global__ void __launch_bounds__(kVecThreads)
    rmsnorm_fwd_vec_kernel(const T* x, const T* w, int64_t d, float eps, T* y, float* rstd) {
  const int64_t row = blockIdx.x;
  const int groups = static_cast<int>(d / 8);
  const T* xr = x + row * d;
  float v[G][8];
  float ss = 0;
#pragma unroll
  for (int k = 0; k < G; ++k) {
    const int j = threadIdx.x + k * kVecThreads;
    if (j < groups) {
      load8(xr + 8 * j, v[k]);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += v[k][e] * v[k][e];
    }
  }
  ss = block_sum(ss);
  const float r = rsqrtf(ss / static_cast<float>(d) + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  T* yr = y + row * d;
#pragma unroll
  for (int k = 0; k < G; ++k) {
    const int j = threadIdx.x + k * kVecThreads;
    if (j < groups) {
      float wv[8];
      load8(w + 8 * j, wv);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[k][e] = wv[e] * to_float(from_float<T>(v[k][e] * r));  // as the scalar kernel
      store8(yr + 8 * j, v[k]);
    }
  }
}

// One block per chunk of kDwRows rows: per row dot (block sum), dx += ..., and the chunk's
// column sums of dy x rstd kept in registers, written to partial[chunk] (when partial).
template <typename T, int G>
__global__ void __launch_bounds__(kVecThreads)
    rmsnorm_bwd_vec_kernel(const T* x, const T* w, const float* rstd, const T* dy, int64_t n, int64_t d, T* dx,
                           float* partial) {
  const int groups = static_cast<int>(d / 8);
  float wv[G][8], acc[G][8];
#pragma unroll
  for (int k = 0; k < G; ++k) {
    const int j = threadIdx.x + k * kVecThreads;
    if (j < groups) load8(w + 8 * j, wv[k]);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[k][e] = 0.f;
  }
  const int64_t r0 = blockIdx.x * kDwRows, r1 = min(n, r0 + kDwRows);
  for (int64_t row = r0; row < r1; ++row) {
    float xv[G][8], gv[G][8];
    float dot = 0;
#pragma unroll
    for (int k = 0; k < G; ++k) {
      const int j = threadIdx.x + k * kVecThreads;
      if (j < groups) {
        load8(x + row * d + 8 * j, xv[k]);
        load8(dy + row * d + 8 * j, gv[k]);
#pragma unroll
        for (int e = 0; e < 8; ++e) dot += wv[k][e] * gv[k][e] * xv[k][e];
      }
    }
    dot = block_sum(dot);
    const float r = rstd[row];
    const float c = dot * r * r * r / static_cast<float>(d);
#pragma unroll
    for (int k = 0; k < G; ++k) {
      const int j = threadIdx.x + k * kVecThreads;
      if (j < groups) {
        float o[8];
        load8(dx + row * d + 8 * j, o);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          o[e] = o[e] + r * wv[k][e] * gv[k][e] - c * xv[k][e];
          acc[k][e] += gv[k][e] * xv[k][e] * r;
        }
        store8(dx + row * d + 8 * j, o);
      }
    }
  }
  if (!partial) return;
#pragma unroll
  for (int k = 0; k < G; ++k) {
    const int j = threadIdx.x + k * kVecThreads;
    if (j < groups) store8(partial + blockIdx.x * d + 8 * j, acc[k]);
  }
}

// The vector kernels' G for this call, 0 when they do not apply.
int vec_groups(int64_t d, std::initializer_list<const void*> ptrs) {
  if (d % 8 != 0 || d > kVecMaxD) return 0;
  for (const void* p : ptrs)
    if (p && !aligned16(p)) return 0;
  const int64_t g = CEIL_DIV(d / 8, static_cast<int64_t>(kVecThreads));
  return g <= 1 ? 1 : g <= 2 ? 2 : 4;
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

template <typename T>
void rmsnorm_fwd(const T* x, const T* w, int64_t n, int64_t d, float eps, T* y, float* rstd, cudaStream_t st) {
  if (n == 0) return;
  switch (vec_groups(d, {x, w, y})) {
    case 1:
      rmsnorm_fwd_vec_kernel<T, 1><<<static_cast<unsigned>(n), kVecThreads, 0, st>>>(x, w, d, eps, y, rstd);
      break;
    case 2:
      rmsnorm_fwd_vec_kernel<T, 2><<<static_cast<unsigned>(n), kVecThreads, 0, st>>>(x, w, d, eps, y, rstd);
      break;
    case 4:
      rmsnorm_fwd_vec_kernel<T, 4><<<static_cast<unsigned>(n), kVecThreads, 0, st>>>(x, w, d, eps, y, rstd);
      break;
    default: rmsnorm_fwd_kernel<<<static_cast<unsigned>(n), 256, 0, st>>>(x, w, d, eps, y, rstd);
  }
  EASYCTX_CUDA_CHECK_LAUNCH("rmsnorm_fwd_kernel");
}

template <typename T>
void rmsnorm_bwd(const T* x, const T* w, const float* rstd, const T* dy, int64_t n, int64_t d, T* dx, float* partial_dw,
                 cudaStream_t st) {
  if (n == 0) return;
  const unsigned chunks = static_cast<unsigned>(ops::rmsnorm_dw_chunks(n));
  switch (vec_groups(d, {x, w, dy, dx, partial_dw})) {
    case 1: rmsnorm_bwd_vec_kernel<T, 1><<<chunks, kVecThreads, 0, st>>>(x, w, rstd, dy, n, d, dx, partial_dw); break;
    case 2: rmsnorm_bwd_vec_kernel<T, 2><<<chunks, kVecThreads, 0, st>>>(x, w, rstd, dy, n, d, dx, partial_dw); break;
    case 4: rmsnorm_bwd_vec_kernel<T, 4><<<chunks, kVecThreads, 0, st>>>(x, w, rstd, dy, n, d, dx, partial_dw); break;
    default:
      rmsnorm_bwd_dx_kernel<<<static_cast<unsigned>(n), 256, 0, st>>>(x, w, rstd, dy, d, dx);
      EASYCTX_CUDA_CHECK_LAUNCH("rmsnorm_bwd_dx_kernel");
      if (partial_dw) {
        dim3 grid(chunks, static_cast<unsigned>(CEIL_DIV(d, 256)));
        rmsnorm_bwd_dw_partial_kernel<<<grid, 256, 0, st>>>(x, rstd, dy, n, d, partial_dw);
        EASYCTX_CUDA_CHECK_LAUNCH("rmsnorm_bwd_dw_partial_kernel");
      }
      return;
  }
  EASYCTX_CUDA_CHECK_LAUNCH("rmsnorm_bwd_vec_kernel");
}

template <typename T>
void reduce_columns_add(const float* partial, int64_t chunks, int64_t d, T* dw, cudaStream_t st) {
  reduce_columns_add_kernel<<<static_cast<unsigned>(CEIL_DIV(d, 256)), 256, 0, st>>>(partial, chunks, d, dw);
  EASYCTX_CUDA_CHECK_LAUNCH("reduce_columns_add_kernel");
}

#define INST(T)                                                                                          \
  template void rmsnorm_fwd<T>(const T*, const T*, int64_t, int64_t, float, T*, float*, cudaStream_t);   \
  template void rmsnorm_bwd<T>(const T*, const T*, const float*, const T*, int64_t, int64_t, T*, float*, \
                               cudaStream_t);                                                            \
  template void reduce_columns_add<T>(const float*, int64_t, int64_t, T*, cudaStream_t);
INST(float)
INST(bf16)
#undef INST

}  // namespace easyctx::kernels
