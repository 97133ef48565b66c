#include "train/adamw_span.h"

#include <cstring>

namespace easyctx::train {
namespace {

// float -> bf16, round to nearest even, NaN kept (quiet): ops::float_to_bf16 without its
// branch, so the loops below vectorise; the same bits for every input.
inline uint16_t bf16_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define EASYCTX_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define EASYCTX_VECTOR_CLONES
#endif

// Scalar, the update was compute-bound (two divisions and a square root per element): ~4 s for
// llama2-7b's 6.7B parameters on 15 threads of an H200 host. Vectorised it is memory-bound
// (30 bytes per element).
EASYCTX_VECTOR_CLONES
void update(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
            uint16_t* __restrict out, int64_t n, const kernels::AdamWConsts k) {
  for (int64_t j = 0; j < n; ++j) {
    kernels::adamw_element(p[j], g[j], m[j], v[j], k);
    out[j] = bf16_rne(p[j]);
  }
}

EASYCTX_VECTOR_CLONES
void convert(const float* __restrict src, uint16_t* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_rne(src[i]);
}

}  // namespace

void adamw_bf16_span(float* p, const float* g, float* m, float* v, uint16_t* out, int64_t n,
                     const kernels::AdamWConsts& k) {
  update(p, g, m, v, out, n, k);
}

void f32_to_bf16_span(const float* src, uint16_t* dst, int64_t n) { convert(src, dst, n); }

}  // namespace easyctx::train
