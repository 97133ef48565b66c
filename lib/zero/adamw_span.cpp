#include "zero/adamw_span.h"

#include "ops/half.h"

namespace easyctx::zero {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define EASYCTX_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define EASYCTX_VECTOR_CLONES
#endif

// Scalar, the update was compute-bound (two divisions and a square root per element): ~4 s for
// llama2-7b's 6.7B parameters on 15 threads of an H200 host. Vectorised it is memory-bound
// (30 bytes per element).
EASYCTX_VECTOR_CLONES
void adamw_bf16_span(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                     uint16_t* __restrict out, int64_t n, const kernels::AdamWConsts& k) {
  const kernels::AdamWConsts c = k;  // (a local copy: no aliasing with the spans)
  for (int64_t j = 0; j < n; ++j) {
    kernels::adamw_element(p[j], g[j], m[j], v[j], c);
    out[j] = ops::float_to_bf16(p[j]);
  }
}

EASYCTX_VECTOR_CLONES
void f32_to_bf16_span(const float* __restrict src, uint16_t* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = ops::float_to_bf16(src[i]);
}

}  // namespace easyctx::zero
