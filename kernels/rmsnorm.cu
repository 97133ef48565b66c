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
// Narrow rows (D <= 256 on the vector path: Qwen3's per-head q/k norms, D = 128 over tokens x
// heads rows) take a lane group of P = pow2(D / 8) <= 32 threads per row (fwd) or per chunk
// (bwd) instead of a 256-thread block with 240 idle: 256 / P rows or chunks per block, the row's
// sums by shuffles in the group. The lanes and sums are the block path's (its other lanes add
// zeros), so the results are bit for bit the same. On the block path, 1M rows of 128 took
// 1.2 ms (fwd) and 4.4 ms (bwd, most of it the column sum of 16K chunk partials by one block) on
// an H100 (logging.profile, 2026-12-07), ~16x the bytes' time; the lane groups' time is not
// measured yet (docs/performance.md). The column sum of many chunks (> kSerialChunks) runs in 32 ordered segments per column.
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

// Sum over the P lanes of an aligned lane group (P a power of two <= 32): the xor butterfly of
// warp_sum from offset P / 2 down, which is warp_sum's result when the other lanes hold zeros.
template <int P>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = P / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Narrow rows, forward: lane group g of the block normalises row blockIdx.x * (256 / P) + g.
template <typename T, int P>
__global__ void __launch_bounds__(kVecThreads)
    rmsnorm_fwd_narrow_kernel(const T* x, const T* w, int64_t n, int64_t d, float eps, T* y, float* rstd) {
  const int lane = threadIdx.x % P;
  const int64_t row = blockIdx.x * int64_t(kVecThreads / P) + threadIdx.x / P;
  const bool has = lane < d / 8;
  float v[8], ss = 0;
  if (row < n && has) {
    load8(x + row * d + 8 * lane, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += v[e] * v[e];
  }
  ss = group_sum<P>(ss);  // (every lane of the warp takes part in the shuffles)
  if (row >= n) return;
  const float r = rsqrtf(ss / static_cast<float>(d) + eps);
  if (lane == 0) rstd[row] = r;
  if (!has) return;
  float wv[8];
  load8(w + 8 * lane, wv);
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = wv[e] * to_float(from_float<T>(v[e] * r));  // as the scalar kernel
  store8(y + row * d + 8 * lane, v);
}

// Narrow rows, backward: lane group g of the block takes chunk blockIdx.x * (256 / P) + g of
// kDwRows rows, in order, as rmsnorm_bwd_vec_kernel's block does.
template <typename T, int P>
__global__ void __launch_bounds__(kVecThreads)
    rmsnorm_bwd_narrow_kernel(const T* x, const T* w, const float* rstd, const T* dy, int64_t n, int64_t d, T* dx,
                              float* partial) {
  const int lane = threadIdx.x % P;
  const int64_t chunk = blockIdx.x * int64_t(kVecThreads / P) + threadIdx.x / P;
  const bool has = lane < d / 8;
  float wv[8], acc[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) wv[e] = 0.f, acc[e] = 0.f;
  if (has) load8(w + 8 * lane, wv);
  const int64_t r0 = chunk * kDwRows, r1 = min(n, r0 + kDwRows);
  const int64_t rows = r1 > r0 ? r1 - r0 : 0;
  // Every lane of the warp runs all kDwRows steps (the shuffles need them all); a group whose
  // chunk is shorter, or past the last, idles through the rest.
  for (int64_t i = 0; i < kDwRows; ++i) {
    const int64_t row = r0 + i;
    const bool act = has && i < rows;
    float xv[8], gv[8], dot = 0;
    if (act) {
      load8(x + row * d + 8 * lane, xv);
      load8(dy + row * d + 8 * lane, gv);
#pragma unroll
      for (int e = 0; e < 8; ++e) dot += wv[e] * gv[e] * xv[e];
    }
    dot = group_sum<P>(dot);
    if (!act) continue;
    const float r = rstd[row];
    const float c = dot * r * r * r / static_cast<float>(d);
    float o[8];
    load8(dx + row * d + 8 * lane, o);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      o[e] = o[e] + r * wv[e] * gv[e] - c * xv[e];
      acc[e] += gv[e] * xv[e] * r;
    }
    store8(dx + row * d + 8 * lane, o);
  }
  if (partial && has && rows > 0) store8(partial + chunk * d + 8 * lane, acc);
}

// Lanes per row of the narrow kernels for this call (8, 16 or 32), 0 when they do not apply.
int narrow_lanes(int64_t d, std::initializer_list<const void*> ptrs) {
  if (d % 8 != 0 || d > 256) return 0;
  for (const void* p : ptrs)
    if (p && !aligned16(p)) return 0;
  return d <= 64 ? 8 : d <= 128 ? 16 : 32;
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

// Many chunks (1M rows of the q/k norms: 16K): per block 32 columns x kSegments warps; warp s
// sums the partials of its contiguous segment of chunks in order, then warp 0 adds the
// segments' sums in order. Deterministic: the order is fixed by the launch shape.
constexpr int64_t kSerialChunks = 1024;  // up to this many, one thread per column sums them all in order
constexpr int kSegments = 32;

template <typename T>
__global__ void __launch_bounds__(32 * kSegments)
    reduce_columns_segmented_kernel(const float* partial, int64_t chunks, int64_t d, T* dw) {
  __shared__ float seg[kSegments][33];
  const int lane = threadIdx.x & 31, s = threadIdx.x >> 5;
  const int64_t c = blockIdx.x * int64_t(32) + lane;
  const int64_t k0 = chunks * s / kSegments, k1 = chunks * (s + 1) / kSegments;
  float acc = 0;
  if (c < d) {
#pragma unroll 8
    for (int64_t k = k0; k < k1; ++k) acc += partial[k * d + c];
  }
  seg[s][lane] = acc;
  __syncthreads();
  if (s != 0 || c >= d) return;
  float total = 0;
  for (int t = 0; t < kSegments; ++t) total += seg[t][lane];
  dw[c] = from_float<T>(to_float(dw[c]) + total);
}

}  // namespace

template <typename T>
void rmsnorm_fwd(const T* x, const T* w, int64_t n, int64_t d, float eps, T* y, float* rstd, cudaStream_t st) {
  if (n == 0) return;
  if (const int p = narrow_lanes(d, {x, w, y}); p != 0) {
    const unsigned blocks = static_cast<unsigned>(CEIL_DIV(n, static_cast<int64_t>(kVecThreads / p)));
    if (p == 8) rmsnorm_fwd_narrow_kernel<T, 8><<<blocks, kVecThreads, 0, st>>>(x, w, n, d, eps, y, rstd);
    if (p == 16) rmsnorm_fwd_narrow_kernel<T, 16><<<blocks, kVecThreads, 0, st>>>(x, w, n, d, eps, y, rstd);
    if (p == 32) rmsnorm_fwd_narrow_kernel<T, 32><<<blocks, kVecThreads, 0, st>>>(x, w, n, d, eps, y, rstd);
    EASYCTX_CUDA_CHECK_LAUNCH("rmsnorm_fwd_narrow_kernel");
    return;
  }
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
  if (const int p = narrow_lanes(d, {x, w, dy, dx, partial_dw}); p != 0) {
    const unsigned blocks =
        static_cast<unsigned>(CEIL_DIV(static_cast<int64_t>(chunks), static_cast<int64_t>(kVecThreads / p)));
    if (p == 8) rmsnorm_bwd_narrow_kernel<T, 8><<<blocks, kVecThreads, 0, st>>>(x, w, rstd, dy, n, d, dx, partial_dw);
    if (p == 16) rmsnorm_bwd_narrow_kernel<T, 16><<<blocks, kVecThreads, 0, st>>>(x, w, rstd, dy, n, d, dx, partial_dw);
    if (p == 32) rmsnorm_bwd_narrow_kernel<T, 32><<<blocks, kVecThreads, 0, st>>>(x, w, rstd, dy, n, d, dx, partial_dw);
    EASYCTX_CUDA_CHECK_LAUNCH("rmsnorm_bwd_narrow_kernel");
    return;
  }
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
  if (chunks > kSerialChunks) {
    reduce_columns_segmented_kernel<<<static_cast<unsigned>(CEIL_DIV(d, 32)), 32 * kSegments, 0, st>>>(partial, chunks,
                                                                                                       d, dw);
    EASYCTX_CUDA_CHECK_LAUNCH("reduce_columns_segmented_kernel");
    return;
  }
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
