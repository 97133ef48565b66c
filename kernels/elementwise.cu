// Elementwise ops and the fp64 sum of squares.
//   convert  dst[n] = src[n]          bytes: n*(sizeof(TS)+sizeof(TD)), no FLOPs
//   fill     x[n] = value             bytes: n*sizeof(T)
//   axpy     y[n] += alpha * x[n]     bytes: n*(2 sizeof(TY) + sizeof(TX)), 2n FLOPs
//   scale    x[n] *= alpha            bytes: 2n*sizeof(T), n FLOPs
//   sum_squares: sum x^2 in fp64      bytes: n*sizeof(T), 2n FLOPs (fp64)
// Grid-stride loops; every sum has a fixed order (per-thread strided partials, then block
// tree, then one block over the per-block partials), so reruns are bit-identical.
#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace easyctx::kernels {
namespace {

template <typename TD, typename TS>
__global__ void convert_kernel(TD* dst, const TS* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = from_float<TD>(to_float(src[i]));
}

template <typename T>
__global__ void fill_kernel(T* x, float value, int64_t n) {
  const T v = from_float<T>(value);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = v;
}

// vec: both pointers 16-byte aligned (for_each_by8).
template <typename TY, typename TX>
__global__ void axpy_kernel(TY* y, const TX* x, float alpha, int64_t n, bool vec) {
  for_each_by8(
      n, vec,
      [&](int64_t i) {
        float a[8], b[8];
        load8(y + i, a);
        load8(x + i, b);
#pragma unroll
        for (int k = 0; k < 8; ++k) a[k] = a[k] + alpha * b[k];
        store8(y + i, a);
      },
      [&](int64_t i) { y[i] = from_float<TY>(to_float(y[i]) + alpha * to_float(x[i])); });
}

template <typename T>
__global__ void scale_kernel(T* x, float alpha, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_float<T>(alpha * to_float(x[i]));
}

// partial[block] = sum over this block's strided elements; launched with a fixed grid.
template <typename T>
__global__ void sum_squares_kernel(const T* x, int64_t n, double* partial) {
  double s = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double v = to_double(x[i]);
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_f64_kernel(const double* x, int64_t n, double* out) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = s;
}

}  // namespace

template <typename TD, typename TS>
void convert(TD* dst, const TS* src, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  convert_kernel<<<elementwise_grid(n, 256), 256, 0, st>>>(dst, src, n);
  EASYCTX_CUDA_CHECK_LAUNCH("convert_kernel");
}

template <typename T>
void fill(T* x, float value, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  fill_kernel<<<elementwise_grid(n, 256), 256, 0, st>>>(x, value, n);
  EASYCTX_CUDA_CHECK_LAUNCH("fill_kernel");
}

template <typename TY, typename TX>
void axpy(TY* y, const TX* x, float alpha, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  const bool vec = aligned16(y) && aligned16(x);
  axpy_kernel<<<vec_grid(n, vec, 256), 256, 0, st>>>(y, x, alpha, n, vec);
  EASYCTX_CUDA_CHECK_LAUNCH("axpy_kernel");
}

template <typename T>
void scale(T* x, float alpha, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  scale_kernel<<<elementwise_grid(n, 256), 256, 0, st>>>(x, alpha, n);
  EASYCTX_CUDA_CHECK_LAUNCH("scale_kernel");
}

template <typename T>
void sum_squares(const T* x, int64_t n, double* partial, double* out, cudaStream_t st) {
  sum_squares_kernel<<<kSumSquaresBlocks, 256, 0, st>>>(x, n, partial);
  EASYCTX_CUDA_CHECK_LAUNCH("sum_squares_kernel");
  sum_f64(partial, kSumSquaresBlocks, out, st);
}

void sum_f64(const double* x, int64_t n, double* out, cudaStream_t st) {
  sum_f64_kernel<<<1, 1024, 0, st>>>(x, n, out);
  EASYCTX_CUDA_CHECK_LAUNCH("sum_f64_kernel");
}

template void convert<float, bf16>(float*, const bf16*, int64_t, cudaStream_t);
template void convert<bf16, float>(bf16*, const float*, int64_t, cudaStream_t);
template void fill<float>(float*, float, int64_t, cudaStream_t);
template void fill<bf16>(bf16*, float, int64_t, cudaStream_t);
template void axpy<float, float>(float*, const float*, float, int64_t, cudaStream_t);
template void axpy<bf16, bf16>(bf16*, const bf16*, float, int64_t, cudaStream_t);
template void axpy<float, bf16>(float*, const bf16*, float, int64_t, cudaStream_t);
template void axpy<bf16, float>(bf16*, const float*, float, int64_t, cudaStream_t);
template void scale<float>(float*, float, int64_t, cudaStream_t);
template void scale<bf16>(bf16*, float, int64_t, cudaStream_t);
template void sum_squares<float>(const float*, int64_t, double*, double*, cudaStream_t);
template void sum_squares<bf16>(const bf16*, int64_t, double*, double*, cudaStream_t);

}  // namespace easyctx::kernels
