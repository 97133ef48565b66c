// CPU GEMM for the reference backend: C[M,N] = alpha * op(A) op(B) + beta * C, row-major
// with leading dimensions. GotoBLAS-style: op(B) is packed into NR-wide panels per
// (KC x NC) block, op(A) into MR-row panels per thread, and a register-blocked MR x NR
// micro-kernel (compiled twice: AVX2+FMA and baseline, picked at load time) does the FMAs.
// Each C element sums k in a fixed order, so results are bit-identical across runs and
// thread counts.
#pragma once
#include <cstdint>

namespace easyctx::ops::cpu {

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc);

}  // namespace easyctx::ops::cpu
