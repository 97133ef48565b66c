#include "ops/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace easyctx::ops::cpu {
namespace {

constexpr int64_t kMR = 6;     // rows of the micro-tile
constexpr int64_t kNR = 16;    // columns of the micro-tile (2 AVX2 vectors of fp32)
constexpr int64_t kKC = 256;   // depth of a packed block (B panel kKC x kNR stays in L1)
constexpr int64_t kNC = 1024;  // columns of a packed B block (kKC x kNC fp32 = 1 MiB in L2/L3)
constexpr int64_t kMC = 96;    // rows of A a thread packs at once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define EASYCTX_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define EASYCTX_MULTIVERSION
#endif

// acc[MR][NR] = sum_k ap[k][:] x bp[k][:]; then C[:mr,:nr] += alpha * acc.
// ap: packed A panel [kc][kMR]; bp: packed B panel [kc][kNR]. GCC vector types keep the
// accumulators in registers (6 x 2 AVX registers for fp32).
template <typename T>
__attribute__((always_inline)) inline void micro_kernel_impl(int64_t kc, const T* ap, const T* bp, T* c, int64_t ldc,
                                                             int64_t mr, int64_t nr, T alpha) {
  constexpr int64_t kW = 32 / sizeof(T);  // lanes of one 256-bit vector
  constexpr int64_t kV = kNR / kW;        // vectors per micro-tile row
  typedef T vec __attribute__((vector_size(32)));
  vec acc[kMR][kV];
#pragma GCC unroll 16
  for (int64_t r = 0; r < kMR; ++r)
#pragma GCC unroll 16
    for (int64_t v = 0; v < kV; ++v) acc[r][v] = vec{};
  for (int64_t p = 0; p < kc; ++p) {
    vec b[kV];
#pragma GCC unroll 16
    for (int64_t v = 0; v < kV; ++v) std::memcpy(&b[v], bp + p * kNR + v * kW, sizeof(vec));
    const T* ak = ap + p * kMR;
#pragma GCC unroll 16
    for (int64_t r = 0; r < kMR; ++r) {
      const T ar = ak[r];
#pragma GCC unroll 16
      for (int64_t v = 0; v < kV; ++v) acc[r][v] += ar * b[v];
    }
  }
  for (int64_t r = 0; r < mr; ++r) {
    for (int64_t v = 0; v < kV; ++v) {
      T lanes[kW];
      std::memcpy(lanes, &acc[r][v], sizeof(vec));
      for (int64_t j = v * kW; j < std::min(nr, (v + 1) * kW); ++j) c[r * ldc + j] += alpha * lanes[j - v * kW];
    }
  }
}

EASYCTX_MULTIVERSION void micro_kernel(int64_t kc, const float* ap, const float* bp, float* c, int64_t ldc, int64_t mr,
                                       int64_t nr, float alpha) {
  micro_kernel_impl(kc, ap, bp, c, ldc, mr, nr, alpha);
}
EASYCTX_MULTIVERSION void micro_kernel(int64_t kc, const double* ap, const double* bp, double* c, int64_t ldc,
                                       int64_t mr, int64_t nr, double alpha) {
  micro_kernel_impl(kc, ap, bp, c, ldc, mr, nr, alpha);
}

// op(X)[i][p] for a row-major X with leading dimension ld.
template <typename T>
inline T at(const T* x, int64_t ld, bool trans, int64_t i, int64_t p) {
  return trans ? x[p * ld + i] : x[i * ld + p];
}

// Packs op(B)[pc:pc+kc, jc:jc+nc] into panels [nc/kNR][kc][kNR], zero-padded.
template <typename T>
void pack_b(const T* b, int64_t ldb, bool trans_b, int64_t pc, int64_t kc, int64_t jc, int64_t nc, T* out) {
  const int64_t panels = (nc + kNR - 1) / kNR;
#pragma omp parallel for schedule(static) if (kc * nc > (1 << 16))
  for (int64_t jp = 0; jp < panels; ++jp) {
    T* dst = out + jp * kc * kNR;
    const int64_t j0 = jc + jp * kNR;
    const int64_t w = std::min(kNR, jc + nc - j0);
    for (int64_t p = 0; p < kc; ++p) {
      T* row = dst + p * kNR;
      if (!trans_b) {
        const T* src = b + (pc + p) * ldb + j0;
        for (int64_t j = 0; j < w; ++j) row[j] = src[j];
      } else {
        for (int64_t j = 0; j < w; ++j) row[j] = b[(j0 + j) * ldb + pc + p];
      }
      for (int64_t j = w; j < kNR; ++j) row[j] = T(0);
    }
  }
}

// Packs op(A)[ic:ic+mc, pc:pc+kc] into panels [mc/kMR][kc][kMR], zero-padded.
template <typename T>
void pack_a(const T* a, int64_t lda, bool trans_a, int64_t ic, int64_t mc, int64_t pc, int64_t kc, T* out) {
  const int64_t panels = (mc + kMR - 1) / kMR;
  for (int64_t ip = 0; ip < panels; ++ip) {
    T* dst = out + ip * kc * kMR;
    const int64_t i0 = ic + ip * kMR;
    const int64_t h = std::min(kMR, ic + mc - i0);
    for (int64_t p = 0; p < kc; ++p) {
      for (int64_t r = 0; r < h; ++r) dst[p * kMR + r] = at(a, lda, trans_a, i0 + r, pc + p);
      for (int64_t r = h; r < kMR; ++r) dst[p * kMR + r] = T(0);
    }
  }
}

template <typename T>
void scale_c(int64_t m, int64_t n, T beta, T* c, int64_t ldc) {
  if (beta == T(1)) return;
#pragma omp parallel for schedule(static) if (m * n > (1 << 16))
  for (int64_t i = 0; i < m; ++i) {
    T* row = c + i * ldc;
    if (beta == T(0)) {
      for (int64_t j = 0; j < n; ++j) row[j] = T(0);  // not 0 * C: C may hold NaN garbage
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
  }
}

// Parallel only when the block has enough FLOPs to pay for waking threads.
inline bool mc_work(int64_t m, int64_t nc, int64_t kc) { return m * nc * kc > (int64_t{1} << 18); }

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc) {
  scale_c(m, n, beta, c, ldc);
  if (m == 0 || n == 0 || k == 0 || alpha == T(0)) return;
  std::vector<T> bpack(static_cast<size_t>(kKC * ((std::min(n, kNC) + kNR - 1) / kNR) * kNR));
  for (int64_t jc = 0; jc < n; jc += kNC) {
    const int64_t nc = std::min(kNC, n - jc);
    for (int64_t pc = 0; pc < k; pc += kKC) {
      const int64_t kc = std::min(kKC, k - pc);
      pack_b(b, ldb, trans_b, pc, kc, jc, nc, bpack.data());
      // Tasks = (row block) x (column chunk) so small-M products still use every thread;
      // each task repacks its A block (cheap next to the FMAs).
      const int64_t mblocks = (m + kMC - 1) / kMC;
      const int64_t jchunk = 256;
      const int64_t jblocks = (nc + jchunk - 1) / jchunk;
#pragma omp parallel if (mc_work(m, nc, kc))
      {
        std::vector<T> apack(static_cast<size_t>(kc * kMC));
#pragma omp for schedule(static)
        for (int64_t task = 0; task < mblocks * jblocks; ++task) {
          const int64_t ic = (task / jblocks) * kMC;
          const int64_t mc = std::min(kMC, m - ic);
          const int64_t j0 = (task % jblocks) * jchunk;
          const int64_t j1 = std::min(nc, j0 + jchunk);
          pack_a(a, lda, trans_a, ic, mc, pc, kc, apack.data());
          for (int64_t jr = j0; jr < j1; jr += kNR) {
            const T* bp = bpack.data() + (jr / kNR) * kc * kNR;
            for (int64_t ir = 0; ir < mc; ir += kMR) {
              micro_kernel(kc, apack.data() + (ir / kMR) * kc * kMR, bp, c + (ic + ir) * ldc + jc + jr, ldc,
                           std::min(kMR, mc - ir), std::min(kNR, nc - jr), alpha);
            }
          }
        }
      }
    }
  }
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*,
                           int64_t, double, double*, int64_t);

}  // namespace easyctx::ops::cpu
