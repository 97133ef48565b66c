// Device helpers shared by kernels/*.cu: fp32 <-> storage conversions, warp and block
// reductions. Included by .cu files only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_check.h"

namespace easyctx::kernels {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ double to_double(float x) { return x; }
__device__ __forceinline__ double to_double(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

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

// 8 consecutive elements as fp32 through 16-byte accesses (one for bf16, two for f32). The
// address must be 16-byte aligned: launchers check aligned16() on the base pointers and take the
// vector path only then, with element offsets that are multiples of 8. The bf16 stores round to
// nearest even, as from_float does.
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&f)[8]) {
  const uint4 r = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&r);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 t = __bfloat1622float2(h[k]);
    f[2 * k] = t.x;
    f[2 * k + 1] = t.y;
  }
}
__device__ __forceinline__ void load8(const float* p, float (&f)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ __forceinline__ void store8(__nv_bfloat16* p, const float (&f)[8]) {
  uint4 r;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
  for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
  *reinterpret_cast<uint4*>(p) = r;
}
__device__ __forceinline__ void store8(float* p, const float (&f)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(f[0], f[1], f[2], f[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(f[4], f[5], f[6], f[7]);
}

// Grid-stride loop over n elements: with vec (every pointer aligned16), group(i) for each
// group of 8 starting at element i, then one(i) for the n mod 8 elements left; without vec,
// one(i) for every element. Launch with vec_grid(n, vec, threads) blocks.
template <typename Group, typename One>
__device__ __forceinline__ void for_each_by8(int64_t n, bool vec, Group group, One one) {
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  int64_t done = 0;
  if (vec) {
    const int64_t groups = n / 8;
    for (int64_t i = tid; i < groups; i += stride) group(8 * i);
    done = groups * 8;
  }
  for (int64_t i = done + tid; i < n; i += stride) one(i);
}

// Grid size for a grid-stride elementwise loop: enough blocks to fill the chip, capped.
inline unsigned elementwise_grid(int64_t n, int threads) {
  int64_t b = CEIL_DIV(n, static_cast<int64_t>(threads));
  if (b > 65536) b = 65536;
  if (b < 1) b = 1;
  return static_cast<unsigned>(b);
}
// The grid of a for_each_by8 loop: one thread per group of 8 with vec, per element without.
inline unsigned vec_grid(int64_t n, bool vec, int threads) {
  return elementwise_grid(vec ? CEIL_DIV(n, 8) : n, threads);
}

}  // namespace easyctx::kernels
