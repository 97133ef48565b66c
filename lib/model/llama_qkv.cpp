// LlamaModel's attention input projections, shared by the training layer (llama.cpp), its
// head-group tiling (llama_head_groups.cpp) and the forward-only scoring (llama_score.cpp):
// q = h1 W_Q^T (+ b_Q) -> (qwen3) RMSNorm per head over hd -> RoPE; k likewise; v = h1 W_V^T
// (+ b_V). Each family adds only its pieces, so a Llama runs exactly the ops it always did.
#include <cmath>

#include "model/llama.h"
#include "model/llama_workspace.h"

namespace easyctx::model {

using ops::Buffer;
using ops::Tensor;

double LlamaModel::attention_scale() const {
  const double af = cfg_.rope_attention_factor();
  return af * af / std::sqrt(static_cast<double>(cfg_.head_dim));
}

namespace {
Tensor part(const Tensor& t, int64_t offset, std::initializer_list<int64_t> dims) {
  return t.empty() ? Tensor() : t.slice_flat(offset, dims);
}
}  // namespace

LlamaModel::QkvWeights LlamaModel::qkv_weights(const LayerParams& p, LayerActs* a, int64_t n, int64_t g, int64_t groups,
                                               bool grads) const {
  const auto& W = grads ? p.g : p.w;
  const auto& B = grads ? p.gb : p.b;
  const int64_t d = cfg_.hidden_size, qd = cfg_.q_dim() / groups, kvd = cfg_.kv_dim() / groups, r = p.rank;
  QkvWeights w;
  w.wq = part(W[kQ], g * qd * d, {qd, d});
  w.wk = part(W[kK], g * kvd * d, {kvd, d});
  w.wv = part(W[kV], g * kvd * d, {kvd, d});
  if (cfg_.qkv_bias) {
    w.bq = part(W[kQBias], g * qd, {qd});
    w.bk = part(W[kKBias], g * kvd, {kvd});
    w.bv = part(W[kVBias], g * kvd, {kvd});
  }
  if (cfg_.qk_norm) {
    w.qn = W[kQNorm];
    w.kn = W[kKNorm];
  }
  Tensor* lb[3] = {&w.lbq, &w.lbk, &w.lbv};
  Tensor* lt[3] = {&w.ltq, &w.ltk, &w.ltv};
  for (int t = kLoraQ; t <= kLoraV; ++t) {  // B's rows of the group (q: qd of them, k and v: kvd)
    if (!p.lora(t)) continue;
    const int64_t rows = t == kLoraQ ? qd : kvd;
    *lb[t] = part(B[static_cast<size_t>(t)], g * rows * r, {rows, r});
    if (a) *lt[t] = a->lora_t[static_cast<size_t>(t)].view({n, r});
  }
  w.lscale = p.scale;
  return w;
}

LlamaModel::QkvActs LlamaModel::qkv_acts(LayerActs& a, int64_t n, int64_t g, int64_t groups) const {
  const int64_t qd = cfg_.q_dim() / groups, kvd = cfg_.kv_dim() / groups;
  const int64_t hq = cfg_.num_heads / groups, hkv = cfg_.num_kv_heads / groups;
  QkvActs r;
  r.q = group_part(a.q, g, groups, n * qd).reshape({n, qd});
  r.k = group_part(a.k, g, groups, n * kvd).reshape({n, kvd});
  r.v = group_part(a.v, g, groups, n * kvd).reshape({n, kvd});
  if (cfg_.qk_norm) {
    r.q_lin = group_part(a.q_lin, g, groups, n * qd).reshape({n, qd});
    r.k_lin = group_part(a.k_lin, g, groups, n * kvd).reshape({n, kvd});
    r.q_rstd = group_part(a.q_rstd, g, groups, n * hq).reshape({n * hq});
    r.k_rstd = group_part(a.k_rstd, g, groups, n * hkv).reshape({n * hkv});
  }
  return r;
}

void LlamaModel::project_qkv(const Tensor& h1, const QkvWeights& w, const QkvActs& a, const Buffer& ones,
                             const Batch& b) {
  const int64_t n = b.tokens_count(), hd = cfg_.head_dim;
  const int64_t hq = a.q.numel() / (n * hd), hkv = a.k.numel() / (n * hd);
  const bool norm = !w.qn.empty();
  const Tensor q = norm ? a.q_lin : a.q, k = norm ? a.k_lin : a.k;
  be_.matmul(h1, false, w.wq, true, q);
  be_.matmul(h1, false, w.wk, true, k);
  be_.matmul(h1, false, w.wv, true, a.v);
  if (!w.lbq.empty()) be_.matmul(w.ltq, false, w.lbq, true, q, w.lscale, 1.0);  // LoRA: + scale (h1 A^T) B^T
  if (!w.lbk.empty()) be_.matmul(w.ltk, false, w.lbk, true, k, w.lscale, 1.0);
  if (!w.lbv.empty()) be_.matmul(w.ltv, false, w.lbv, true, a.v, w.lscale, 1.0);
  if (!w.bq.empty()) {
    add_bias(ones, w.bq, q);
    add_bias(ones, w.bk, k);
    add_bias(ones, w.bv, a.v);
  }
  if (norm) {
    be_.rmsnorm_fwd(q.reshape({n * hq, hd}), w.qn, cfg_.rms_norm_eps, a.q.reshape({n * hq, hd}), a.q_rstd);
    be_.rmsnorm_fwd(k.reshape({n * hkv, hd}), w.kn, cfg_.rms_norm_eps, a.k.reshape({n * hkv, hd}), a.k_rstd);
  }
  be_.rope(a.q.reshape({n, hq, hd}), b.positions, inv_freq_.flat(), false);
  be_.rope(a.k.reshape({n, hkv, hd}), b.positions, inv_freq_.flat(), false);
}

void LlamaModel::qkv_backward(const QkvWeights& w, const QkvWeights& gw, const QkvActs& a, const Tensor& dq,
                              const Tensor& dk, const Tensor& dv, const Tensor& scratch, const Buffer& ones,
                              const Batch& b) {
  const int64_t n = b.tokens_count(), hd = cfg_.head_dim;
  const int64_t hq = dq.numel() / (n * hd), hkv = dk.numel() / (n * hd);
  be_.rope(dq.reshape({n, hq, hd}), b.positions, inv_freq_.flat(), true);
  be_.rope(dk.reshape({n, hkv, hd}), b.positions, inv_freq_.flat(), true);
  if (!w.qn.empty()) {  // through the per-head norms (rmsnorm_bwd adds into dx: a zeroed scratch)
    for (int i = 0; i < 2; ++i) {
      const Tensor& dy = i == 0 ? dq : dk;
      const int64_t rows = n * (i == 0 ? hq : hkv);
      const Tensor dx = scratch.reshape({scratch.numel()}).slice_flat(0, {rows, hd});
      be_.fill(dx, 0);
      be_.rmsnorm_bwd((i == 0 ? a.q_lin : a.k_lin).reshape({rows, hd}), i == 0 ? w.qn : w.kn,
                      i == 0 ? a.q_rstd : a.k_rstd, dy.reshape({rows, hd}), dx, i == 0 ? gw.qn : gw.kn);
      be_.copy(dy.reshape({rows, hd}), dx);
    }
  }
  if (!gw.bq.empty()) {  // (LoRA: the biases are frozen)
    bias_grad(ones, dq, gw.bq);
    bias_grad(ones, dk, gw.bk);
    bias_grad(ones, dv, gw.bv);
  }
}

void LlamaModel::add_bias(const Buffer& ones, const Tensor& bias, const Tensor& y) {
  const int64_t n = y.dim(0), m = y.numel() / n;
  be_.matmul(ones.flat().slice_flat(0, {n, 1}), false, bias.reshape({1, m}), false, y, 1.0, 1.0);
}

void LlamaModel::bias_grad(const Buffer& ones, const Tensor& dy, const Tensor& gbias) {
  const int64_t n = dy.dim(0), m = dy.numel() / n;
  be_.matmul(ones.flat().slice_flat(0, {1, n}), false, dy, false, gbias.reshape({1, m}), 1.0, 1.0);
}

}  // namespace easyctx::model
