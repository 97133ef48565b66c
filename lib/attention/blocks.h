// Helpers shared by the sequence-parallel strategies (internal to lib/attention): views of
// one sequence or of a run of rows, the type partial outputs merge in, LSE column copies,
// and the size check every strategy starts with.
#pragma once
#include "attention/attention.h"
#include "core/error.h"
#include "ops/ops.h"

namespace easyctx::attention::detail {

// Sequence b of a [B, S, ...] tensor as a [1, S, ...] view.
inline ops::Tensor seq(const ops::Tensor& t, int64_t b) { return t.rows(b, 1); }

// Sequence b of every tensor of a call.
inline AttentionTensors seq(const AttentionTensors& t, int64_t b) {
  return {seq(t.q, b), seq(t.k, b), seq(t.v, b), seq(t.o, b), seq(t.lse, b), t.scale, t.docs ? t.docs + b : nullptr,
          t.window};
}
inline AttentionGrads seq(const AttentionGrads& g, int64_t b) {
  return {seq(g.dout, b), seq(g.dq, b), seq(g.dk, b), seq(g.dv, b)};
}

// Rows [row, row+len) of a [1, S, H, hd] view, as [1, len, H, hd].
inline ops::Tensor seq_rows(const ops::Tensor& t, int64_t row, int64_t len) {
  const int64_t H = t.dim(2), hd = t.dim(3);
  return t.slice_flat(row * H * hd, {1, len, H, hd});
}

// The fp32 (fp64 for fp64 data) type that partial outputs are merged in.
inline ops::DType acc_type(const ops::Tensor& lse) { return lse.dtype; }

// Copies lse[1, H, S] columns [col, col+len) into dst [1, H, len] (to_block) or back.
inline void copy_lse_cols(ops::Backend& be, const ops::Tensor& lse, int64_t col, const ops::Tensor& block,
                          bool to_block) {
  const int64_t H = lse.dim(1), S = lse.dim(2), len = block.dim(2);
  for (int64_t h = 0; h < H; ++h) {
    ops::Tensor full = lse.slice_flat(h * S + col, {len});
    ops::Tensor part = block.slice_flat(h * len, {len});
    if (to_block) be.copy(part, full);
    else be.copy(full, part);
  }
}

inline void check_sizes(const AttentionTensors& t) {
  const ops::Tensor &q = t.q, &k = t.k, &v = t.v, &o = t.o, &lse = t.lse;
  EASYCTX_CHECK(q.ndim == 4 && k.ndim == 4 && v.ndim == 4, "sequence-parallel attention: q/k/v must be [B, S, H, hd]");
  EASYCTX_CHECK(k.dim(0) == q.dim(0) && k.dim(1) == q.dim(1) && v.numel() == k.numel(),
                "sequence-parallel attention: q ", q.describe(), " and k ", k.describe(), " disagree");
  EASYCTX_CHECK(o.numel() == q.numel() && lse.numel() == q.dim(0) * q.dim(1) * q.dim(2),
                "sequence-parallel attention: o ", o.describe(), " or lse ", lse.describe(), " has the wrong size");
}

}  // namespace easyctx::attention::detail
