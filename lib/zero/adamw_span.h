// The host AdamW's inner loop (parallel.zero.offload_optimizer, lib/zero/host_adamw.cpp): the
// update of kernels/adamw_math.h over a span and the bf16 copy of the new weights, in one pass.
// Compiled with -ffp-contract=off -fno-math-errno so it vectorises and still gives the CUDA
// kernel's bits (every operation an IEEE float operation, sqrt correctly rounded, nothing fused);
// on x86-64 with GCC the widest vector ISA the CPU has (AVX-512F, AVX2, else SSE2) is picked at
// load time. Built on every backend so the CPU tests check it against the scalar element update.
#pragma once
#include <cstdint>

#include "kernels/adamw_math.h"

namespace easyctx::zero {

// p, m, v updated in place from g; out[j] = bf16(p[j]) after the update (round to nearest even,
// NaN stays NaN: ops::float_to_bf16's bits). The spans must not overlap.
void adamw_bf16_span(float* p, const float* g, float* m, float* v, uint16_t* out, int64_t n,
                     const kernels::AdamWConsts& k);

// dst[i] = bf16(src[i]), the same rounding, vectorised.
void f32_to_bf16_span(const float* src, uint16_t* dst, int64_t n);

}  // namespace easyctx::zero
