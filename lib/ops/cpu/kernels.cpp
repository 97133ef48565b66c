#include "ops/cpu/kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "ops/cpu/gemm.h"
#include "ops/scratch.h"

namespace easyctx::ops::cpu {

// Below this much work a parallel region costs more than it saves (and on a loaded
// machine a thread wake-up can cost milliseconds).
constexpr int64_t kParallelMin = 1 << 15;

// ---------------------------------------------------------------- embedding
template <typename T>
void embedding_fwd(const int32_t* ids, int64_t n, const T* table, int64_t vocab, int64_t d, T* out) {
  for (int64_t i = 0; i < n; ++i)
    EASYCTX_CHECK(ids[i] >= 0 && ids[i] < vocab, "embedding: token id ", ids[i], " at row ", i,
                  " outside the vocabulary [0, ", vocab, ")");
#pragma omp parallel for schedule(static) if (n * d > kParallelMin)
  for (int64_t i = 0; i < n; ++i) std::copy(table + ids[i] * d, table + (ids[i] + 1) * d, out + i * d);
}

template <typename T>
void embedding_bwd(const int32_t* ids, int64_t n, const T* dout, int64_t vocab, int64_t d, T* dtable) {
  for (int64_t i = 0; i < n; ++i)
    EASYCTX_CHECK(ids[i] >= 0 && ids[i] < vocab, "embedding_bwd: token id ", ids[i], " outside [0, ", vocab, ")");
  // Columns split across threads, rows in order: repeated ids sum deterministically.
  const int64_t chunk = 64;
#pragma omp parallel for schedule(static) if (n * d > kParallelMin)
  for (int64_t c0 = 0; c0 < d; c0 += chunk) {
    const int64_t c1 = std::min(d, c0 + chunk);
    for (int64_t i = 0; i < n; ++i) {
      T* dst = dtable + ids[i] * d;
      const T* src = dout + i * d;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

// ---------------------------------------------------------------- RMSNorm
template <typename T, typename S>
void rmsnorm_fwd(const T* x, const T* w, int64_t n, int64_t d, double eps, T* y, S* rstd) {
#pragma omp parallel for schedule(static) if (n * d > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T* xi = x + i * d;
    S ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += static_cast<S>(xi[j]) * static_cast<S>(xi[j]);
    const S r = static_cast<S>(1.0 / std::sqrt(static_cast<double>(ss) / static_cast<double>(d) + eps));
    rstd[i] = r;
    T* yi = y + i * d;
    for (int64_t j = 0; j < d; ++j) yi[j] = w[j] * static_cast<T>(static_cast<S>(xi[j]) * r);
  }
}

template <typename T, typename S>
void rmsnorm_bwd(const T* x, const T* w, const S* rstd, const T* dy, int64_t n, int64_t d, T* dx, T* dw) {
#pragma omp parallel for schedule(static) if (n * d > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T* xi = x + i * d;
    const T* gi = dy + i * d;
    const T r = static_cast<T>(rstd[i]);
    T dot = 0;  // sum_k w_k dy_k x_k
    for (int64_t j = 0; j < d; ++j) dot += w[j] * gi[j] * xi[j];
    const T c = dot * r * r * r / static_cast<T>(d);
    T* dxi = dx + i * d;
    for (int64_t j = 0; j < d; ++j) dxi[j] += r * w[j] * gi[j] - c * xi[j];
  }
  if (!dw) return;
  const int64_t chunk = 64;
#pragma omp parallel for schedule(static) if (n * d > kParallelMin)
  for (int64_t c0 = 0; c0 < d; c0 += chunk) {
    const int64_t c1 = std::min(d, c0 + chunk);
    for (int64_t i = 0; i < n; ++i) {
      const T r = static_cast<T>(rstd[i]);
      for (int64_t c = c0; c < c1; ++c) dw[c] += dy[i * d + c] * x[i * d + c] * r;
    }
  }
}

// ---------------------------------------------------------------- RoPE
template <typename T>
void rope(T* x, int64_t n, int64_t heads, int64_t hd, const int32_t* pos, const float* inv_freq, bool inverse) {
  const int64_t half = hd / 2;
#pragma omp parallel if (n * heads * hd > kParallelMin)
  {
    std::vector<T> cs(static_cast<size_t>(2 * half));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        // fp32 angle, as HF (inv_freq @ position_ids in float32) and vLLM compute it.
        const float angle = static_cast<float>(pos[t]) * inv_freq[i];
        cs[static_cast<size_t>(i)] = static_cast<T>(std::cos(static_cast<double>(angle)));
        const double s = std::sin(static_cast<double>(angle));
        cs[static_cast<size_t>(half + i)] = static_cast<T>(inverse ? -s : s);
      }
      for (int64_t h = 0; h < heads; ++h) {
        T* xh = x + (t * heads + h) * hd;
        for (int64_t i = 0; i < half; ++i) {
          const T c = cs[static_cast<size_t>(i)], s = cs[static_cast<size_t>(half + i)];
          const T x1 = xh[i], x2 = xh[half + i];
          xh[i] = x1 * c - x2 * s;
          xh[half + i] = x2 * c + x1 * s;
        }
      }
    }
  }
}

// ---------------------------------------------------------------- attention
namespace {
// Keys [first, end) of this block visible to query row i (causal: none after the query;
// window: none at or before the query's position - window).
struct KeyRange {
  int64_t first, end;
};
inline KeyRange visible_keys(const AttnShape& s, const AttentionBlock& blk, int64_t i) {
  const int64_t at = blk.q_offset + i - blk.k_offset;  // the query's position among the keys
  const int64_t end = blk.causal ? std::max<int64_t>(0, std::min(s.sk, at + 1)) : s.sk;
  const int64_t first = blk.window > 0 ? std::min(end, std::max<int64_t>(0, at - blk.window + 1)) : 0;
  return {first, end};
}
// Vectorised (the simd reduction fixes one summation order per build, so results stay
// deterministic run to run).
template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}
}  // namespace

template <typename T, typename S>
__attribute__((always_inline)) inline void attention_fwd_impl(const T* q, const T* k, const T* v, const AttnShape& s,
                                                              const AttentionBlock& blk, T* o, S* lse) {
  const int64_t group = s.hq / s.hkv;
  const int64_t rows = s.batch * s.hq * s.sq;
  const T scale = static_cast<T>(blk.scale);
#pragma omp parallel if (rows * s.sk * s.hd > kParallelMin)
  {
    std::vector<T> p(static_cast<size_t>(std::max<int64_t>(1, s.sk)));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = r / (s.hq * s.sq), h = (r / s.sq) % s.hq, i = r % s.sq, g = h / group;
      const T* qi = q + ((b * s.sq + i) * s.hq + h) * s.hd;
      T* oi = o + ((b * s.sq + i) * s.hq + h) * s.hd;
      S* li = lse + (b * s.hq + h) * s.sq + i;
      const KeyRange kr = visible_keys(s, blk, i);
      const int64_t j0 = kr.first, nk = kr.end;
      std::fill(oi, oi + s.hd, T(0));
      if (nk == j0) {
        *li = -std::numeric_limits<S>::infinity();
        continue;
      }
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = j0; j < nk; ++j) {
        const T sc = scale * dot(qi, k + ((b * s.sk + j) * s.hkv + g) * s.hd, s.hd);
        p[static_cast<size_t>(j)] = sc;
        mx = std::max(mx, sc);
      }
      T sum = 0;
      for (int64_t j = j0; j < nk; ++j) sum += (p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx));
      const T inv = T(1) / sum;
      for (int64_t j = j0; j < nk; ++j) {
        const T pj = p[static_cast<size_t>(j)] * inv;
        const T* vj = v + ((b * s.sk + j) * s.hkv + g) * s.hd;
#pragma omp simd
        for (int64_t c = 0; c < s.hd; ++c) oi[c] += pj * vj[c];
      }
      *li = static_cast<S>(mx + std::log(sum));
    }
  }
}

template <typename T, typename S>
__attribute__((always_inline)) inline void attention_bwd_impl(const T* q, const T* k, const T* v, const T* o,
                                                              const S* lse, const T* dout, const AttnShape& s,
                                                              const AttentionBlock& blk, T* dq, T* dk, T* dv) {
  const int64_t group = s.hq / s.hkv;
  const T scale = static_cast<T>(blk.scale);
  // One task per (batch, kv head): it owns dk/dv of that head, so no two threads write
  // the same row and the sums run in a fixed order.
#pragma omp parallel for schedule(static) if (s.batch * s.hkv > 1 && s.sq * s.sk * s.hd > kParallelMin)
  for (int64_t task = 0; task < s.batch * s.hkv; ++task) {
    const int64_t b = task / s.hkv, g = task % s.hkv;
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t i = 0; i < s.sq; ++i) {
        const KeyRange kr = visible_keys(s, blk, i);
        if (kr.end == kr.first) continue;
        const int64_t qrow = ((b * s.sq + i) * s.hq + h) * s.hd;
        const T* qi = q + qrow;
        const T* doi = dout + qrow;
        T* dqi = dq + qrow;
        const T di = dot(doi, o + qrow, s.hd);
        const T li = static_cast<T>(lse[(b * s.hq + h) * s.sq + i]);
        for (int64_t j = kr.first; j < kr.end; ++j) {
          const int64_t krow = ((b * s.sk + j) * s.hkv + g) * s.hd;
          const T pij = std::exp(scale * dot(qi, k + krow, s.hd) - li);
          const T dsij = pij * (dot(doi, v + krow, s.hd) - di) * scale;
          const T* kj = k + krow;
          T* dkj = dk + krow;
          T* dvj = dv + krow;
#pragma omp simd
          for (int64_t c = 0; c < s.hd; ++c) {
            dqi[c] += dsij * kj[c];
            dkj[c] += dsij * qi[c];
            dvj[c] += pij * doi[c];
          }
        }
      }
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define EASYCTX_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define EASYCTX_MULTIVERSION
#endif

// The hot attention loops, compiled for AVX2+FMA and baseline x86-64 (picked at load).
EASYCTX_MULTIVERSION void attention_fwd_f32(const float* q, const float* k, const float* v, const AttnShape& s,
                                            const AttentionBlock& blk, float* o, float* lse) {
  attention_fwd_impl(q, k, v, s, blk, o, lse);
}
EASYCTX_MULTIVERSION void attention_bwd_f32(const float* q, const float* k, const float* v, const float* o,
                                            const float* lse, const float* dout, const AttnShape& s,
                                            const AttentionBlock& blk, float* dq, float* dk, float* dv) {
  attention_bwd_impl(q, k, v, o, lse, dout, s, blk, dq, dk, dv);
}

template <typename T, typename S>
void attention_fwd(const T* q, const T* k, const T* v, const AttnShape& s, const AttentionBlock& blk, T* o, S* lse) {
  if constexpr (std::is_same_v<T, float>) attention_fwd_f32(q, k, v, s, blk, o, lse);
  else attention_fwd_impl(q, k, v, s, blk, o, lse);
}

template <typename T, typename S>
void attention_bwd(const T* q, const T* k, const T* v, const T* o, const S* lse, const T* dout, const AttnShape& s,
                   const AttentionBlock& blk, T* dq, T* dk, T* dv) {
  if constexpr (std::is_same_v<T, float>) attention_bwd_f32(q, k, v, o, lse, dout, s, blk, dq, dk, dv);
  else attention_bwd_impl(q, k, v, o, lse, dout, s, blk, dq, dk, dv);
}

template <typename T, typename S>
void attention_merge(T* o, S* lse, const T* o_blk, const S* lse_blk, int64_t batch, int64_t sq, int64_t hq,
                     int64_t hd) {
  const int64_t rows = batch * hq * sq;
#pragma omp parallel for schedule(static) if (rows * hd > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / (hq * sq), h = (r / sq) % hq, i = r % sq;
    S& l = lse[r];
    const S lb = lse_blk[r];
    if (std::isinf(lb) && lb < 0) continue;
    T* oi = o + ((b * sq + i) * hq + h) * hd;
    const T* obi = o_blk + ((b * sq + i) * hq + h) * hd;
    // lse = max + log1p(exp(min - max)), in the statistics type.
    const S mx = std::max(l, lb), mn = std::min(l, lb);
    const S nl = (std::isinf(mn) && mn < 0) ? mx : mx + std::log1p(std::exp(mn - mx));
    const T wa = static_cast<T>(std::exp(l - nl)), wb = static_cast<T>(std::exp(lb - nl));
    for (int64_t c = 0; c < hd; ++c) oi[c] = oi[c] * wa + obi[c] * wb;
    l = nl;
  }
}

// ---------------------------------------------------------------- SwiGLU
template <typename T>
void swiglu_fwd(const T* g, const T* u, int64_t n, T* h) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T sg = T(1) / (T(1) + std::exp(-g[i]));
    h[i] = g[i] * sg * u[i];
  }
}

template <typename T>
void swiglu_bwd(const T* g, const T* u, const T* dh, int64_t n, T* dg, T* du) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T sg = T(1) / (T(1) + std::exp(-g[i]));
    du[i] = dh[i] * g[i] * sg;
    dg[i] = dh[i] * u[i] * sg * (T(1) + g[i] * (T(1) - sg));
  }
}

// ---------------------------------------------------------------- LM head + cross entropy
namespace {
// logsumexp of one row of logits (lm_head_loss and lm_head_score: the same operations, so
// their NLLs agree bit for bit).
template <typename T>
T row_lse(const T* lr, int64_t vocab) {
  T mx = lr[0];
  for (int64_t j = 1; j < vocab; ++j) mx = std::max(mx, lr[j]);
  T sum = 0;
  for (int64_t j = 0; j < vocab; ++j) sum += std::exp(lr[j] - mx);
  return mx + std::log(sum);
}
}  // namespace

template <typename T>
LossSums lm_head_loss(const T* x, const T* w, const int32_t* labels, int64_t n, int64_t d, int64_t vocab, int64_t tile,
                      double grad_scale, T* dx, T* dw) {
  for (int64_t i = 0; i < n; ++i)
    EASYCTX_CHECK(labels[i] >= -1 && labels[i] < vocab, "lm_head_loss: label ", labels[i], " at row ", i,
                  " outside [-1, ", vocab, ")");
  // Cap the logits tile at 16M elements whatever the config asks (CPU memory).
  tile = lm_head_tile_rows(tile, n, vocab, kCpuMaxTileLogits);
  std::vector<T> logits(static_cast<size_t>(tile * vocab));
  std::vector<double> nll(static_cast<size_t>(n), 0.0);
  LossSums out;
  for (int64_t t0 = 0; t0 < n; t0 += tile) {
    const int64_t tl = std::min(tile, n - t0);
    gemm<T>(false, true, tl, vocab, d, T(1), x + t0 * d, d, w, d, T(0), logits.data(), vocab);
#pragma omp parallel for schedule(static) if (tl * vocab > kParallelMin)
    for (int64_t r = 0; r < tl; ++r) {
      T* lr = logits.data() + r * vocab;
      const int32_t lab = labels[t0 + r];
      if (lab < 0) {
        if (dx) std::fill(lr, lr + vocab, T(0));
        continue;
      }
      const T lse = row_lse(lr, vocab);
      nll[static_cast<size_t>(t0 + r)] = static_cast<double>(lse - lr[lab]);
      if (dx) {
        const T gs = static_cast<T>(grad_scale);
        for (int64_t j = 0; j < vocab; ++j) lr[j] = gs * std::exp(lr[j] - lse);
        lr[lab] -= gs;
      }
    }
    if (dx) {
      gemm<T>(false, false, tl, d, vocab, T(1), logits.data(), vocab, w, d, T(0), dx + t0 * d, d);
      if (dw) gemm<T>(true, false, vocab, d, tl, T(1), logits.data(), vocab, x + t0 * d, d, T(1), dw, d);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] < 0) continue;
    out.sum_nll += nll[static_cast<size_t>(i)];
    ++out.count;
  }
  return out;
}

template <typename T>
void lm_head_score(const T* x, const T* w, const int32_t* labels, int64_t n, int64_t d, int64_t vocab, int64_t tile,
                   double* nll, int32_t* top) {
  for (int64_t i = 0; i < n; ++i)
    EASYCTX_CHECK(labels[i] >= -1 && labels[i] < vocab, "lm_head_score: label ", labels[i], " at row ", i,
                  " outside [-1, ", vocab, ")");
  tile = lm_head_tile_rows(tile, n, vocab, kCpuMaxTileLogits);
  std::vector<T> logits(static_cast<size_t>(std::min(tile, n) * vocab));
  for (int64_t t0 = 0; t0 < n; t0 += tile) {
    const int64_t tl = std::min(tile, n - t0);
    gemm<T>(false, true, tl, vocab, d, T(1), x + t0 * d, d, w, d, T(0), logits.data(), vocab);
#pragma omp parallel for schedule(static) if (tl * vocab > kParallelMin)
    for (int64_t r = 0; r < tl; ++r) {
      const T* lr = logits.data() + r * vocab;
      const int32_t lab = labels[t0 + r];
      nll[t0 + r] = 0;
      top[t0 + r] = 0;
      if (lab < 0) continue;
      int64_t best = 0;  // the first index of the largest logit
      for (int64_t j = 1; j < vocab; ++j)
        if (lr[j] > lr[best]) best = j;
      nll[t0 + r] = static_cast<double>(row_lse(lr, vocab) - lr[lab]);
      top[t0 + r] = best == lab ? 1 : 0;
    }
  }
}

// ---------------------------------------------------------------- AdamW
void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& s) {
  const double bc1 = 1.0 - std::pow(s.beta1, static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(s.beta2, static_cast<double>(s.step));
  const double decay = 1.0 - s.lr * s.weight_decay;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const double gi = g[i];
    const double mi = s.beta1 * m[i] + (1.0 - s.beta1) * gi;
    const double vi = s.beta2 * v[i] + (1.0 - s.beta2) * gi * gi;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    const double denom = std::sqrt(vi / bc2) + s.eps;
    p[i] = static_cast<float>(p[i] * decay - s.lr * (mi / bc1) / denom);
  }
}

#define EASYCTX_INSTANTIATE(T, S)                                                                                   \
  template void embedding_fwd<T>(const int32_t*, int64_t, const T*, int64_t, int64_t, T*);                          \
  template void embedding_bwd<T>(const int32_t*, int64_t, const T*, int64_t, int64_t, T*);                          \
  template void rmsnorm_fwd<T, S>(const T*, const T*, int64_t, int64_t, double, T*, S*);                            \
  template void rmsnorm_bwd<T, S>(const T*, const T*, const S*, const T*, int64_t, int64_t, T*, T*);                \
  template void rope<T>(T*, int64_t, int64_t, int64_t, const int32_t*, const float*, bool);                         \
  template void attention_fwd<T, S>(const T*, const T*, const T*, const AttnShape&, const AttentionBlock&, T*, S*); \
  template void attention_bwd<T, S>(const T*, const T*, const T*, const T*, const S*, const T*, const AttnShape&,   \
                                    const AttentionBlock&, T*, T*, T*);                                             \
  template void attention_merge<T, S>(T*, S*, const T*, const S*, int64_t, int64_t, int64_t, int64_t);              \
  template void swiglu_fwd<T>(const T*, const T*, int64_t, T*);                                                     \
  template void swiglu_bwd<T>(const T*, const T*, const T*, int64_t, T*, T*);                                       \
  template LossSums lm_head_loss<T>(const T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, double, \
                                    T*, T*);                                                                        \
  template void lm_head_score<T>(const T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, double*,   \
                                 int32_t*);

EASYCTX_INSTANTIATE(float, float)
EASYCTX_INSTANTIATE(double, double)

}  // namespace easyctx::ops::cpu
