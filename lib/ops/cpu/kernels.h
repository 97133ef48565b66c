// Reference kernels of the CPU backend, templated on the storage/compute type T (float for
// training, double for gradient checks and the golden test). Statistics type S = float for
// T = float (the fp32 LSE/rstd of the interface) and double for T = double.
// Parallel loops only split independent rows/columns; every sum runs in a fixed order.
#pragma once
#include <cstdint>

#include "ops/ops.h"

namespace easyctx::ops::cpu {

template <typename T>
struct Stat {
  using type = float;
};
template <>
struct Stat<double> {
  using type = double;
};

template <typename T>
void embedding_fwd(const int32_t* ids, int64_t n, const T* table, int64_t vocab, int64_t d, T* out);
template <typename T>
void embedding_bwd(const int32_t* ids, int64_t n, const T* dout, int64_t vocab, int64_t d, T* dtable);

template <typename T, typename S>
void rmsnorm_fwd(const T* x, const T* w, int64_t n, int64_t d, double eps, T* y, S* rstd);
template <typename T, typename S>
void rmsnorm_bwd(const T* x, const T* w, const S* rstd, const T* dy, int64_t n, int64_t d, T* dx, T* dw);

template <typename T>
void rope(T* x, int64_t n, int64_t heads, int64_t hd, const int32_t* pos, const float* inv_freq, bool inverse);

struct AttnShape {
  int64_t batch, sq, sk, hq, hkv, hd;
};
template <typename T, typename S>
void attention_fwd(const T* q, const T* k, const T* v, const AttnShape& s, const AttentionBlock& blk, T* o, S* lse);
template <typename T, typename S>
void attention_bwd(const T* q, const T* k, const T* v, const T* o, const S* lse, const T* dout, const AttnShape& s,
                   const AttentionBlock& blk, T* dq, T* dk, T* dv);
template <typename T, typename S>
void attention_merge(T* o, S* lse, const T* o_blk, const S* lse_blk, int64_t batch, int64_t sq, int64_t hq, int64_t hd);

template <typename T>
void swiglu_fwd(const T* g, const T* u, int64_t n, T* h);
template <typename T>
void swiglu_bwd(const T* g, const T* u, const T* dh, int64_t n, T* dg, T* du);

template <typename T>
LossSums lm_head_loss(const T* x, const T* w, const int32_t* labels, int64_t n, int64_t d, int64_t vocab, int64_t tile,
                      double grad_scale, T* dx, T* dw);

// Per-row NLL (as lm_head_loss computes it) and argmax flag of the labelled rows (0 elsewhere).
template <typename T>
void lm_head_score(const T* x, const T* w, const int32_t* labels, int64_t n, int64_t d, int64_t vocab, int64_t tile,
                   double* nll, int32_t* top);

void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& s);

}  // namespace easyctx::ops::cpu
