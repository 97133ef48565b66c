// Device helpers shared by kernels/*.cu: fp32 <-> storage conversions, warp and block
// reductions. Included by .cu files only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_check.h"

namespace easyctx::kernels {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ double to_double(float x) { return x; }
__device__ __forceinline__ double to_double(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// The order is fixed by the launch shape, so reruns are bit-identical.
template <typename V>
__device__ __forceinline__ V block_sum(V v) {
  __shared__ V part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  V r = lane < nw ? part[lane] : V(0);
  return warp_sum(r);
}

__device__ __forceinline__ float block_max(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float r = lane < nw ? part[lane] : -INFINITY;
  return warp_max(r);
}

// Grid size for a grid-stride elementwise loop: enough blocks to fill the chip, capped.
inline unsigned elementwise_grid(int64_t n, int threads) {
  int64_t b = CEIL_DIV(n, static_cast<int64_t>(threads));
  if (b > 65536) b = 65536;
  if (b < 1) b = 1;
  return static_cast<unsigned>(b);
}

}  // namespace easyctx::kernels
