// RoPE, HF half-split layout, in place: x [n, H, hd], positions i32[n], inv_freq f32[hd/2].
// Pair (i, i + hd/2) of token t turns by angle = (float)pos[t] * inv_freq[i] (fp32, as HF),
// cos/sin with full-range fp32 sincosf (accurate for the large angles of long contexts).
// One thread per (token, pair): angle computed once and applied to every head. With hd/2 a
// multiple of 8 and x 16-byte aligned, one thread per (token, 8 consecutive pairs) through
// 16-byte accesses instead (the same formula per element).
//   bytes: 2 n H hd sizeof(T) + 4n + 2 hd; ~6 n H hd/2 FLOPs + n hd/2 sincos
#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace easyctx::kernels {
namespace {

template <typename T>
__global__ void rope_kernel(T* x, int64_t n, int64_t heads, int64_t hd, const int32_t* pos, const float* inv_freq,
                            bool inverse) {
  const int64_t half = hd / 2;
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= n * half) return;
  const int64_t t = idx / half, i = idx % half;
  const float angle = static_cast<float>(pos[t]) * inv_freq[i];
  float s, c;
  sincosf(angle, &s, &c);
  if (inverse) s = -s;
  T* xt = x + t * heads * hd;
  for (int64_t h = 0; h < heads; ++h) {
    T* xh = xt + h * hd;
    const float x1 = to_float(xh[i]), x2 = to_float(xh[half + i]);
    xh[i] = from_float<T>(x1 * c - x2 * s);
    xh[half + i] = from_float<T>(x2 * c + x1 * s);
  }
}

template <typename T>
__global__ void rope_vec_kernel(T* x, int64_t n, int64_t heads, int64_t hd, const int32_t* pos, const float* inv_freq,
                                bool inverse) {
  const int64_t half = hd / 2, per_token = half / 8;
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= n * per_token) return;
  const int64_t t = idx / per_token, i0 = (idx % per_token) * 8;
  const float p = static_cast<float>(pos[t]);
  float c[8], s[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    sincosf(p * inv_freq[i0 + e], &s[e], &c[e]);
    if (inverse) s[e] = -s[e];
  }
  T* xt = x + t * heads * hd;
  for (int64_t h = 0; h < heads; ++h) {
    T* xh = xt + h * hd;
    float a[8], b[8], ra[8], rb[8];
    load8(xh + i0, a);
    load8(xh + half + i0, b);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      ra[e] = a[e] * c[e] - b[e] * s[e];
      rb[e] = b[e] * c[e] + a[e] * s[e];
    }
    store8(xh + i0, ra);
    store8(xh + half + i0, rb);
  }
}

}  // namespace

template <typename T>
void rope(T* x, int64_t n, int64_t heads, int64_t hd, const int32_t* pos, const float* inv_freq, bool inverse,
          cudaStream_t st) {
  const int64_t work = n * (hd / 2);
  if (work == 0) return;
  if ((hd / 2) % 8 == 0 && aligned16(x)) {
    rope_vec_kernel<<<static_cast<unsigned>(CEIL_DIV(work / 8, 256)), 256, 0, st>>>(x, n, heads, hd, pos, inv_freq,
                                                                                    inverse);
    EASYCTX_CUDA_CHECK_LAUNCH("rope_vec_kernel");
    return;
  }
  rope_kernel<<<static_cast<unsigned>(CEIL_DIV(work, 256)), 256, 0, st>>>(x, n, heads, hd, pos, inv_freq, inverse);
  EASYCTX_CUDA_CHECK_LAUNCH("rope_kernel");
}

template void rope<float>(float*, int64_t, int64_t, int64_t, const int32_t*, const float*, bool, cudaStream_t);
template void rope<bf16>(bf16*, int64_t, int64_t, int64_t, const int32_t*, const float*, bool, cudaStream_t);

}  // namespace easyctx::kernels
