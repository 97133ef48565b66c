#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/checked.h"
#include "attention/head_grouped.h"
#include "core/error.h"
#include "model/llama_workspace.h"

namespace easyctx::model {

using ops::Buffer;
using ops::Tensor;


LlamaModel::LlamaModel(const LlamaConfig& cfg, ops::Backend& be, DType dtype, ModelOptions opts,
                       std::shared_ptr<attention::SequenceAttention> attn)
    : cfg_(cfg),
      layout_(cfg),
      be_(be),
      dtype_(dtype),
      grad_dtype_(opts.f32_grads ? DType::F32 : dtype),
      opts_(opts),
      attn_(std::move(attn)) {
  cfg_.validate();
  if (!attn_) attn_ = std::make_shared<attention::LocalAttention>(be_);
  EASYCTX_CHECK_INPUT(opts_.head_groups >= 1 && cfg_.num_kv_heads % opts_.head_groups == 0,
                      "activation.attention_head_groups: ", opts_.head_groups,
                      " does not divide the model's key/value heads (", cfg_.num_kv_heads, ")");
  group_attn_ = attn_;
  if (const auto* hg = dynamic_cast<const attention::HeadGroupedAttention*>(attn_.get()); hg && opts_.head_groups > 1) {
    EASYCTX_CHECK(hg->groups() == opts_.head_groups, "LlamaModel: a strategy in ", hg->groups(),
                  " head groups for a model tiled in ", opts_.head_groups);
    group_attn_ = hg->inner();
  }
  const std::vector<float> f = cfg_.inv_freq();
  inv_freq_ = be_.alloc(DType::F32, static_cast<int64_t>(f.size()), "RoPE inverse frequencies");
  Buffer host(const_cast<float*>(f.data()), f.size() * 4, DType::F32, MemSpace::Host, nullptr);
  be_.copy(inv_freq_.flat(), host.flat());
}

LlamaModel::~LlamaModel() = default;

Tensor LlamaModel::tensor_view(const Tensor& unit, size_t ui, size_t ti) const {
  const ParamTensor& t = layout_.units().at(ui).tensors.at(ti);
  return unit.slice_flat(t.offset, {t.numel}).reshape(t.shape);
}

void LlamaModel::check_params(const std::vector<Tensor>& params, const char* what) const {
  check_params(params, what, dtype_);
}

void LlamaModel::check_params(const std::vector<Tensor>& params, const char* what, DType want) const {
  EASYCTX_CHECK(params.size() == layout_.num_units(), "LlamaModel: ", layout_.num_units(), " ", what,
                " units expected, got ", params.size());
  for (size_t u = 0; u < params.size(); ++u) {
    EASYCTX_CHECK(params[u].numel() == layout_.units()[u].numel && params[u].dtype == want, "LlamaModel: ", what,
                  " unit ", layout_.units()[u].name, " is ", params[u].describe(), ", expected ",
                  ops::type_name(want), "[", layout_.units()[u].numel, "]");
  }
}

// The LM-head matrix [V, D] inside `units` (parameters or gradients): lm_head.weight, or the
// embedding when tied.
Tensor LlamaModel::head_matrix(const std::vector<Tensor>& units) const {
  if (cfg_.tie_word_embeddings) return units[layout_.embed_unit()].reshape({cfg_.vocab_size, cfg_.hidden_size});
  return tensor_view(units[layout_.head_unit()], layout_.head_unit(), 1);
}

// Every buffer of the workspace for (batch, seq), in allocation order: visit(name, dtype,
// numel, slot, pinned_host), slot null when only planning (workspace_specs). The single
// source of truth for both the allocation and the memory plan.
template <class Visit>
void LlamaModel::visit_workspace(const LlamaConfig& c, const ModelOptions& o, DType dt, int64_t batch, int64_t seq,
                                 bool for_backward, Workspace* ws, Visit&& visit) {
  // Every product below is at most tokens x max(hidden, q, intermediate, heads) or a head
  // tile of logits: checked once here (InputError naming the sizes), plain afterwards.
  const std::string what = "the model's workspace for a micro-batch of " + std::to_string(batch) + " x " +
                           std::to_string(seq) + " tokens";
  const int64_t n = checked_elements({batch, seq}, what);
  c.check_tokens(n, o.lm_head_tile, what);
  const int64_t d = c.hidden_size, ff = c.intermediate_size;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), L = c.num_layers;
  const DType st = stat_dtype(dt);
  const bool keep_all = for_backward && o.checkpoint == CheckpointPolicy::None;
  const bool offload = for_backward && o.offload_checkpoints;
  EASYCTX_CHECK(!(offload && keep_all), "LlamaModel: offload_checkpoints needs checkpoint policy Layer or "
                "AttentionOutput (activation.checkpoint layer or attention_output)");
  const int64_t mt = mlp_rows(o, n, keep_all);
  // Head groups: q, k, v, o, lse and the gradients for one group (checkpoint none: the layer's
  // activations for every group, group-major); the attention-output checkpoints stay whole.
  const int64_t G = o.head_groups;
  EASYCTX_CHECK_INPUT(G >= 1 && c.num_kv_heads % G == 0, "activation.attention_head_groups: ", G,
                      " does not divide the model's key/value heads (", c.num_kv_heads, ")");
  const int64_t per = keep_all ? 1 : G;  // acts hold 1/per of the heads
  const int64_t lse_n = batch * c.num_heads * seq;
  auto put = [&](const std::string& name, DType t, int64_t numel, Buffer* slot, bool pinned = false) {
    visit(name, t, numel, slot, pinned);
  };
  auto idx = [](const char* base, size_t i) { return std::string(base) + "." + std::to_string(i); };
  const OffloadRing ring{offload ? offloaded_inputs(o, L) : 0};
  // Kept attention outputs (layers keep_from..L-1): those of layers below K - 1 leave.
  const int64_t keep_from = first_kept_output(o, L), kept = L - keep_from;
  const OffloadRing saved_ring{std::max<int64_t>(0, ring.K - 1 - keep_from)};
  if (ws) {
    ws->ring = ring;
    ws->saved_ring = saved_ring;
    ws->keep_from = keep_from;
  }
  const size_t n_resid = for_backward ? ring.slots(L) : 2;
  if (ws) ws->resid.resize(n_resid);
  for (size_t l = 0; l < n_resid; ++l) put(idx("resid", l), dt, n * d, ws ? &ws->resid[l] : nullptr);
  const size_t n_host_resid = static_cast<size_t>(ring.K);
  if (ws) ws->host_resid.resize(n_host_resid);
  for (size_t l = 0; l < n_host_resid; ++l)
    put(idx("host.resid", l), dt, n * d, ws ? &ws->host_resid[l] : nullptr, true);
  const size_t n_acts = keep_all ? static_cast<size_t>(L) : 1;
  if (ws) ws->acts.resize(n_acts);
  for (size_t i = 0; i < n_acts; ++i) {
    LayerActs* a = ws ? &ws->acts[i] : nullptr;
    put(idx("acts", i) + ".h1", dt, n * d, a ? &a->h1 : nullptr);
    put(idx("acts", i) + ".rstd1", st, n, a ? &a->rstd1 : nullptr);
    put(idx("acts", i) + ".q", dt, n * qd / per, a ? &a->q : nullptr);
    put(idx("acts", i) + ".k", dt, n * kvd / per, a ? &a->k : nullptr);
    put(idx("acts", i) + ".v", dt, n * kvd / per, a ? &a->v : nullptr);
    put(idx("acts", i) + ".o", dt, n * qd / per, a ? &a->o : nullptr);
    put(idx("acts", i) + ".lse", st, lse_n / per, a ? &a->lse : nullptr);
    put(idx("acts", i) + ".x_mid", dt, n * d, a ? &a->x_mid : nullptr);
    put(idx("acts", i) + ".h2", dt, mt * d, a ? &a->h2 : nullptr);  // (MLP tiles: one tile's, see layer_forward)
    put(idx("acts", i) + ".rstd2", st, n, a ? &a->rstd2 : nullptr);
    put(idx("acts", i) + ".g", dt, mt * ff, a ? &a->g : nullptr);
    put(idx("acts", i) + ".u", dt, mt * ff, a ? &a->u : nullptr);
    put(idx("acts", i) + ".m", dt, mt * ff, a ? &a->m : nullptr);
  }
  if (for_backward && o.checkpoint == CheckpointPolicy::AttentionOutput) {
    // Streamed (offload with head groups): two group-sized device slots, every layer in host memory.
    const bool streamed = o.streams_attention_output();
    const size_t n_saved = streamed ? 2 : saved_ring.slots(kept - 1);
    const size_t n_host = streamed ? static_cast<size_t>(kept) : static_cast<size_t>(saved_ring.K);
    const int64_t per_dev = streamed ? G : 1;
    if (ws) {
      ws->streamed = streamed;
      ws->saved_o.resize(n_saved);
      ws->saved_lse.resize(n_saved);
      ws->host_o.resize(n_host);
      ws->host_lse.resize(n_host);
    }
    for (size_t l = 0; l < n_saved; ++l) {
      put(idx("saved_o", l), dt, n * qd / per_dev, ws ? &ws->saved_o[l] : nullptr);
      put(idx("saved_lse", l), st, lse_n / per_dev, ws ? &ws->saved_lse[l] : nullptr);
    }
    for (size_t l = 0; l < n_host; ++l) {
      put(idx("host.saved_o", l), dt, n * qd, ws ? &ws->host_o[l] : nullptr, true);
      put(idx("host.saved_lse", l), st, lse_n, ws ? &ws->host_lse[l] : nullptr, true);
    }
  }
  // hf (final norm output) is dead once the head's backward has run: it doubles as dattn.
  put("hf", dt, n * (for_backward ? std::max(d, qd / G) : d), ws ? &ws->hf : nullptr);
  put("rstd_f", st, n, ws ? &ws->rstd_f : nullptr);
  if (G > 1) put("wo_g", dt, d * qd / G, ws ? &ws->wo : nullptr);
  if (!for_backward) return;
  if (G > 1) put("dwo_g", o.f32_grads ? DType::F32 : dt, d * qd / G, ws ? &ws->dwo : nullptr);
  put("dx", dt, n * d, ws ? &ws->dx : nullptr);
  put("dh", dt, n * d, ws ? &ws->dh : nullptr);
  put("dm", dt, mt * ff, ws ? &ws->dm : nullptr);
  put("dg", dt, mt * ff, ws ? &ws->dg : nullptr);
  put("du", dt, mt * ff, ws ? &ws->du : nullptr);
  put("dq", dt, n * qd / G, ws ? &ws->dq : nullptr);
  put("dk", dt, n * kvd / G, ws ? &ws->dk : nullptr);
  put("dv", dt, n * kvd / G, ws ? &ws->dv : nullptr);
}

// Rows per MLP tile: activation.mlp_tile when it splits the tokens and the layer is
// recomputed in backward (with checkpoint none every layer keeps its whole MLP activations).
int64_t LlamaModel::mlp_rows(const ModelOptions& o, int64_t n, bool keep_all) {
  return (!keep_all && o.mlp_tile > 0 && o.mlp_tile < n) ? o.mlp_tile : n;
}

std::vector<BufferSpec> LlamaModel::workspace_specs(const LlamaConfig& c, const ModelOptions& o, DType dtype,
                                                    int64_t batch, int64_t seq, bool backward) {
  std::vector<BufferSpec> v;
  visit_workspace(c, o, dtype, batch, seq, backward, nullptr,
                  [&](const std::string& name, DType t, int64_t numel, Buffer*, bool pinned) {
                    v.push_back({name, t, numel, pinned});
                  });
  const DType gt = o.f32_grads ? DType::F32 : dtype;
  if (backward && gt != dtype) {  // the embedding backward's scratch (kept across steps)
    v.push_back({"embed_grad_scratch", dtype, c.vocab_size * c.hidden_size});
    v.push_back({"embed_grad_f32", DType::F32, c.vocab_size * c.hidden_size});
  }
  return v;
}

LlamaModel::Workspace& LlamaModel::workspace(const Batch& b, bool for_backward) {
  EASYCTX_CHECK(b.batch > 0 && b.seq > 0, "LlamaModel: empty batch ", b.batch, "x", b.seq);
  for (const Tensor* t : {&b.tokens, &b.positions, &b.labels})
    EASYCTX_CHECK(t->dtype == DType::I32 && t->numel() == b.tokens_count(), "LlamaModel: batch arrays must be i32[",
                  b.tokens_count(), "], got ", t->describe());
  if (ws_ && ws_->batch == b.batch && ws_->seq == b.seq && ws_->backward == for_backward) return *ws_;
  ws_.reset();  // free first: peak memory is one workspace
  auto ws = std::make_unique<Workspace>();
  ws->batch = b.batch;
  ws->seq = b.seq;
  ws->backward = for_backward;
  ws->offload = for_backward && opts_.offload_checkpoints;
  visit_workspace(cfg_, opts_, dtype_, b.batch, b.seq, for_backward, ws.get(),
                  [&](const std::string&, DType t, int64_t numel, Buffer* slot, bool pinned) {
                    *slot = pinned ? be_.alloc_host_pinned(t, numel) : be_.alloc(t, numel);
                  });
  ws_ = std::move(ws);
  return *ws_;
}

// Rows [r0, r0 + rows) of the MLP's input norm (h2, rstd2) from x_mid, into the tile-sized h2:
// RMSNorm is row by row, so these are the rows the whole-sequence norm would give.
Tensor LlamaModel::mlp_norm_tile(const Tensor& w, LayerActs& a, const Tensor& x_mid, int64_t r0, int64_t rows) {
  const size_t ui = layout_.layer_unit(0);
  const int64_t d = cfg_.hidden_size, n = x_mid.numel() / d;
  const Tensor h2t = a.h2.flat().slice_flat(0, {rows, d});
  be_.rmsnorm_fwd(x_mid.rows(r0, rows), tensor_view(w, ui, kMlpNorm), cfg_.rms_norm_eps, h2t,
                  a.rstd2.view({n}).rows(r0, rows));
  return h2t;
}

// attention_done: a.o and a.lse already hold this layer's attention (restored from the
// attention_output checkpoint), so the recompute skips the attention itself. with_mlp false
// (the backward's recompute) stops at h2: the MLP is recomputed tile by tile in
// layer_backward, and the layer output is not needed there.
// Head groups > 1: attention_forward_grouped (attention_done: o comes from saved_o).
void LlamaModel::layer_forward(const Tensor& w, const Tensor& x_in, const Batch& b, LayerActs& a, Workspace& ws,
                               const Tensor& x_out, bool attention_done, bool with_mlp, const Tensor& saved_o,
                               const Tensor& saved_lse) {
  const size_t ui = layout_.layer_unit(0);  // offsets are the same in every layer unit
  auto W = [&](LayerTensor t) { return tensor_view(w, ui, t); };
  const int64_t n = b.tokens_count(), d = cfg_.hidden_size, ff = cfg_.intermediate_size, hd = cfg_.head_dim;
  const int64_t hq = cfg_.num_heads, hkv = cfg_.num_kv_heads;
  const Tensor h1 = a.h1.view({n, d}), x_mid = a.x_mid.view({n, d});
  be_.rmsnorm_fwd(x_in, W(kAttnNorm), cfg_.rms_norm_eps, h1, a.rstd1.view({n}));
  if (opts_.head_groups > 1) {
    attention_forward_grouped(w, h1, b, a, ws, x_mid, attention_done, saved_o, saved_lse);
  } else {
    const Tensor q = a.q.view({n, hq * hd}), k = a.k.view({n, hkv * hd});
    const Tensor v = a.v.view({n, hkv * hd}), o = a.o.view({n, hq * hd});
    be_.matmul(h1, false, W(kQ), true, q);
    be_.matmul(h1, false, W(kK), true, k);
    be_.matmul(h1, false, W(kV), true, v);
    be_.rope(q.reshape({n, hq, hd}), b.positions, inv_freq_.flat(), false);
    be_.rope(k.reshape({n, hkv, hd}), b.positions, inv_freq_.flat(), false);
    if (!attention_done)
      attn_->forward({q.reshape({b.batch, b.seq, hq, hd}), k.reshape({b.batch, b.seq, hkv, hd}),
                      v.reshape({b.batch, b.seq, hkv, hd}), o.reshape({b.batch, b.seq, hq, hd}),
                      a.lse.view({b.batch, hq, b.seq}), 1.0 / std::sqrt(static_cast<double>(hd))});
    be_.matmul(o, false, W(kO), true, x_mid);
  }
  be_.axpy(x_mid, x_in, 1.0);
  // MLP, a tile of rows at a time (one tile unless activation.mlp_tile splits the tokens). Its
  // input norm is row by row, so with tiles h2 holds one tile's rows, normed per tile here and
  // again in layer_backward (the same rows, the same values): one [n, D] buffer fewer.
  const int64_t mt = a.g.numel() / ff;
  const bool tiled = mt < n;
  if (!tiled) be_.rmsnorm_fwd(x_mid, W(kMlpNorm), cfg_.rms_norm_eps, a.h2.view({n, d}), a.rstd2.view({n}));
  if (!with_mlp) return;
  for (int64_t r0 = 0; r0 < n; r0 += mt) {
    const int64_t rows = std::min(mt, n - r0);
    const Tensor h2t = tiled ? mlp_norm_tile(w, a, x_mid, r0, rows) : a.h2.view({n, d}).rows(r0, rows);
    const Tensor g = a.g.view({rows, ff}), u = a.u.view({rows, ff}), m = a.m.view({rows, ff});
    be_.matmul(h2t, false, W(kGate), true, g);
    be_.matmul(h2t, false, W(kUp), true, u);
    be_.swiglu_fwd(g, u, m);
    be_.matmul(m, false, W(kDown), true, x_out.rows(r0, rows));
  }
  be_.axpy(x_out, x_mid, 1.0);
}

// dx: gradient w.r.t. the layer output on entry, w.r.t. the layer input on return.
// recompute_mlp: a.g/u/m do not hold this layer's MLP activations (the layer was
// recomputed without its MLP): recompute them tile by tile here.
void LlamaModel::layer_backward(const Tensor& w, const Tensor& gw, const Tensor& x_in, const Batch& b, LayerActs& a,
                                Workspace& ws, const Tensor& dx, bool recompute_mlp, const Tensor& saved_o,
                                const Tensor& saved_lse) {
  const size_t ui = layout_.layer_unit(0);
  auto W = [&](LayerTensor t) { return tensor_view(w, ui, t); };
  auto G = [&](LayerTensor t) { return tensor_view(gw, ui, t); };
  const int64_t n = b.tokens_count(), d = cfg_.hidden_size, ff = cfg_.intermediate_size, hd = cfg_.head_dim;
  const int64_t hq = cfg_.num_heads, hkv = cfg_.num_kv_heads;
  // MLP: x_out = x_mid + down(silu(gate(h2)) * up(h2)), a tile of rows at a time (tiles: h2
  // and rstd2 normed again per tile, as in layer_forward).
  const Tensor dh = ws.dh.view({n, d}), x_mid = a.x_mid.view({n, d});
  const int64_t mt = a.g.numel() / ff;
  const bool tiled = mt < n;
  for (int64_t r0 = 0; r0 < n; r0 += mt) {
    const int64_t rows = std::min(mt, n - r0);
    const Tensor g = a.g.view({rows, ff}), u = a.u.view({rows, ff}), m = a.m.view({rows, ff});
    const Tensor dm = ws.dm.view({rows, ff}), dg = ws.dg.view({rows, ff}), du = ws.du.view({rows, ff});
    const Tensor h2t = tiled ? mlp_norm_tile(w, a, x_mid, r0, rows) : a.h2.view({n, d}).rows(r0, rows);
    const Tensor dxt = dx.rows(r0, rows), dht = dh.rows(r0, rows);
    if (recompute_mlp) {
      be_.matmul(h2t, false, W(kGate), true, g);
      be_.matmul(h2t, false, W(kUp), true, u);
      be_.swiglu_fwd(g, u, m);
    }
    be_.matmul(dxt, false, W(kDown), false, dm);
    be_.matmul(dxt, true, m, false, G(kDown), 1.0, 1.0);
    be_.swiglu_bwd(g, u, dm, dg, du);
    be_.matmul(dg, false, W(kGate), false, dht);
    be_.matmul(du, false, W(kUp), false, dht, 1.0, 1.0);
    be_.matmul(dg, true, h2t, false, G(kGate), 1.0, 1.0);
    be_.matmul(du, true, h2t, false, G(kUp), 1.0, 1.0);
  }
  be_.rmsnorm_bwd(a.x_mid.view({n, d}), W(kMlpNorm), a.rstd2.view({n}), dh, dx, G(kMlpNorm));
  if (opts_.head_groups > 1) {
    attention_backward_grouped(w, gw, b, a, ws, dx, saved_o, saved_lse);
    be_.rmsnorm_bwd(x_in, W(kAttnNorm), a.rstd1.view({n}), dh, dx, G(kAttnNorm));
    return;
  }
  // Attention: x_mid = x_in + o_proj(attn(rope(q), rope(k), v))
  const Tensor dattn = ws.hf.view({n, hq * hd}), dq = ws.dq.view({n, hq * hd});
  const Tensor dk = ws.dk.view({n, hkv * hd}), dv = ws.dv.view({n, hkv * hd}), h1 = a.h1.view({n, d});
  be_.matmul(dx, false, W(kO), false, dattn);
  be_.matmul(dx, true, a.o.view({n, hq * hd}), false, G(kO), 1.0, 1.0);
  attn_->backward({a.q.view({b.batch, b.seq, hq, hd}), a.k.view({b.batch, b.seq, hkv, hd}),
                   a.v.view({b.batch, b.seq, hkv, hd}), a.o.view({b.batch, b.seq, hq, hd}),
                   a.lse.view({b.batch, hq, b.seq}), 1.0 / std::sqrt(static_cast<double>(hd))},
                  {dattn.reshape({b.batch, b.seq, hq, hd}), dq.reshape({b.batch, b.seq, hq, hd}),
                   dk.reshape({b.batch, b.seq, hkv, hd}), dv.reshape({b.batch, b.seq, hkv, hd})});
  be_.rope(dq.reshape({n, hq, hd}), b.positions, inv_freq_.flat(), true);
  be_.rope(dk.reshape({n, hkv, hd}), b.positions, inv_freq_.flat(), true);
  be_.matmul(dq, false, W(kQ), false, dh);
  be_.matmul(dk, false, W(kK), false, dh, 1.0, 1.0);
  be_.matmul(dv, false, W(kV), false, dh, 1.0, 1.0);
  be_.matmul(dq, true, h1, false, G(kQ), 1.0, 1.0);
  be_.matmul(dk, true, h1, false, G(kK), 1.0, 1.0);
  be_.matmul(dv, true, h1, false, G(kV), 1.0, 1.0);
  be_.rmsnorm_bwd(x_in, W(kAttnNorm), a.rstd1.view({n}), dh, dx, G(kAttnNorm));
}

// Embedding and every layer; fills the residual stream (and every layer's acts when kept).
// Offload: each checkpoint leaves its ring slot while the next layer computes, and the slot
// is written again only once its copy is done.
void LlamaModel::forward_trunk(ParamSource& src, const Batch& b, Workspace& ws, bool keep) {
  const int64_t n = b.tokens_count(), d = cfg_.hidden_size, L = cfg_.num_layers;
  const size_t eu = layout_.embed_unit(), hu = layout_.head_unit();
  for (ops::CopyFence* f : {ws.resid_out, ws.saved_out, ws.fetched, ws.stream_fence}) f[0] = f[1] = {};  // the last call waited all
  be_.embedding_fwd(b.tokens, checked(src.acquire(eu), eu, dtype_, "parameter").reshape({cfg_.vocab_size, d}),
                    ws.stream(0, n, d));
  src.release(eu);
  for (int64_t l = 0; l < L; ++l) {
    LayerActs& a = ws.acts[keep ? static_cast<size_t>(l) : 0];
    if (ws.offload) {  // layer l writes over layer l-1's input, and sends its own out meanwhile
      be_.wait_copy(ws.resid_out[(l + 1) % 2]);
      if (ws.ring.offloaded(l))
        ws.resid_out[l % 2] = be_.copy_async(ws.host_resid[static_cast<size_t>(l)].flat(),
                                             ws.resid[ws.ring.slot(l)].flat());
    }
    const bool save = ws.keeps_output(l);
    const size_t s = save && !ws.streamed ? ws.saved_slot(l) : 0;
    if (save && ws.offload && !ws.streamed) be_.wait_copy(ws.saved_out[l % 2]);  // layer l-2's copy out of this slot
    // Head groups: each group's o and LSE go to their part of the slot as they are computed
    // (streamed: to their part of the layer's host buffers, through the group slots).
    const bool grouped_save = save && opts_.head_groups > 1;
    const size_t ui = layout_.layer_unit(l);
    layer_forward(checked(src.acquire(ui), ui, dtype_, "parameter"), ws.stream(l, n, d), b, a, ws,
                  ws.stream(l + 1, n, d), false, true, grouped_save ? ws.saved_o_of(l) : Tensor(),
                  grouped_save ? ws.saved_lse_of(l) : Tensor());
    src.release(ui);
    if (save && !ws.streamed) {
      if (!grouped_save) {
        be_.copy(ws.saved_o[s].flat(), a.o.flat());
        be_.copy(ws.saved_lse[s].flat(), a.lse.flat());
      }
      if (ws.saved_offloaded(l)) {  // (the fence of the second copy covers the first: one stream)
        be_.copy_async(ws.host_o[ws.saved_host(l)].flat(), ws.saved_o[s].flat());
        ws.saved_out[l % 2] = be_.copy_async(ws.host_lse[ws.saved_host(l)].flat(), ws.saved_lse[s].flat());
      }
    }
  }
  const Tensor head = checked(src.acquire(hu), hu, dtype_, "parameter");
  be_.rmsnorm_fwd(ws.stream(cfg_.num_layers, n, d), tensor_view(head, hu, 0), cfg_.rms_norm_eps, ws.hf.view({n, d}),
                  ws.rstd_f.view({n}));
  src.release(hu);
}

Tensor LlamaModel::checked(const Tensor& t, size_t u, DType want, const char* what) const {
  EASYCTX_CHECK(t.numel() == layout_.units()[u].numel && t.dtype == want, "LlamaModel: ", what, " unit ",
                layout_.units()[u].name, " is ", t.describe(), ", expected ", ops::type_name(want), "[",
                layout_.units()[u].numel, "]");
  return t;
}

Tensor LlamaModel::head_matrix(const Tensor& embed, const Tensor& head) const {
  if (cfg_.tie_word_embeddings) return embed.reshape({cfg_.vocab_size, cfg_.hidden_size});
  return tensor_view(head, layout_.head_unit(), 1);
}

std::vector<size_t> LlamaModel::acquire_order() const {
  const size_t eu = layout_.embed_unit(), hu = layout_.head_unit();
  std::vector<size_t> v{eu};
  for (int64_t l = 0; l < cfg_.num_layers; ++l) v.push_back(layout_.layer_unit(l));
  v.push_back(hu);
  v.push_back(hu);
  if (cfg_.tie_word_embeddings) v.push_back(eu);
  for (int64_t l = cfg_.num_layers - 1; l >= 0; --l) v.push_back(layout_.layer_unit(l));
  return v;
}

ops::LossSums LlamaModel::forward_backward(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                           const Batch& b, double grad_scale) {
  check_params(params, "parameter");
  check_params(grads, "gradient", grad_dtype_);
  VectorParamSource src(params, grads);
  return forward_backward(src, b, grad_scale);
}

ops::LossSums LlamaModel::forward_backward(ParamSource& src, const Batch& b, double grad_scale) {
  Workspace& ws = workspace(b, true);
  const bool keep = opts_.checkpoint == CheckpointPolicy::None;
  src.begin(acquire_order());
  forward_trunk(src, b, ws, keep);
  const int64_t n = b.tokens_count(), d = cfg_.hidden_size, vocab = cfg_.vocab_size;
  const size_t hu = layout_.head_unit(), eu = layout_.embed_unit();
  const Tensor dx = ws.dx.view({n, d}), dhf = ws.dh.view({n, d});
  const Tensor hp = checked(src.acquire(hu), hu, dtype_, "parameter");
  const Tensor ep = cfg_.tie_word_embeddings ? checked(src.acquire(eu), eu, dtype_, "parameter") : Tensor();
  const Tensor hg = checked(src.grad(hu), hu, grad_dtype_, "gradient");
  const Tensor eg = checked(src.grad(eu), eu, grad_dtype_, "gradient");
  const ops::LossSums loss = be_.lm_head_loss(ws.hf.view({n, d}), head_matrix(ep, hp), b.labels, opts_.lm_head_tile,
                                              grad_scale, dhf, head_matrix(eg, hg));
  be_.fill(dx, 0.0);
  be_.rmsnorm_bwd(ws.stream(cfg_.num_layers, n, d), tensor_view(hp, hu, 0), ws.rstd_f.view({n}), dhf, dx,
                  tensor_view(hg, hu, 0));
  if (cfg_.tie_word_embeddings) src.release(eu);
  src.release(hu);
  src.grad_done(hu);
  const int64_t L = cfg_.num_layers;
  for (int64_t l = L - 1; l >= 0; --l) {
    const size_t ui = layout_.layer_unit(l);
    const Tensor x_in = ws.stream(l, n, d);
    LayerActs& a = ws.acts[keep ? static_cast<size_t>(l) : 0];
    if (ws.offload) {
      // Layer l-1's checkpoint comes back while layer l computes, into the ring slots that
      // layer l+1 (or the head) used last; layer l's came back during layer l+1, unless it
      // never left.
      const int64_t j = l - 1;
      if (j >= 0 && ws.ring.offloaded(j)) {
        const size_t s = static_cast<size_t>(j % 2);
        ws.fetched[s] = be_.copy_async(ws.resid[s].flat(), ws.host_resid[static_cast<size_t>(j)].flat());
        if (!ws.streamed && ws.saved_offloaded(j)) {
          const size_t so = ws.saved_slot(j), h = ws.saved_host(j);
          be_.copy_async(ws.saved_o[so].flat(), ws.host_o[h].flat());
          ws.fetched[s] = be_.copy_async(ws.saved_lse[so].flat(), ws.host_lse[h].flat());
        }
      }
      if (ws.ring.offloaded(l)) be_.wait_copy(ws.fetched[l % 2]);
    }
    const Tensor w = checked(src.acquire(ui), ui, dtype_, "parameter");
    const Tensor gw = checked(src.grad(ui), ui, grad_dtype_, "gradient");
    // Head groups with attention_output: each group's o and LSE are read in the slot.
    const bool restored = !keep && ws.keeps_output(l);
    const bool in_slot = restored && opts_.head_groups > 1;
    const Tensor so = in_slot ? ws.saved_o_of(l) : Tensor();
    const Tensor sl = in_slot ? ws.saved_lse_of(l) : Tensor();
    if (!keep) {  // recompute from the checkpoint (layer input, plus o/lse for attention_output)
      if (restored && !in_slot) {
        be_.copy(a.o.flat(), ws.saved_o[ws.saved_slot(l)].flat());
        be_.copy(a.lse.flat(), ws.saved_lse[ws.saved_slot(l)].flat());
      }
      layer_forward(w, x_in, b, a, ws, Tensor(), restored, false, so, sl);
    }
    layer_backward(w, gw, x_in, b, a, ws, dx, !keep, so, sl);
    src.release(ui);
    src.grad_done(ui);
  }
  const Tensor dembed = eg.reshape({vocab, d});
  if (grad_dtype_ == dtype_) {
    be_.embedding_bwd(b.tokens, dx, dembed);
  } else {  // the embedding backward needs dtable in dx's dtype: scratch, then add in f32
    if (embed_grad_scratch_.numel() != vocab * d) {
      embed_grad_scratch_ = be_.alloc(dtype_, vocab * d);
      embed_grad_f32_ = be_.alloc(DType::F32, vocab * d);
    }
    be_.fill(embed_grad_scratch_.flat(), 0.0);
    be_.embedding_bwd(b.tokens, dx, embed_grad_scratch_.view({vocab, d}));
    be_.copy(embed_grad_f32_.flat(), embed_grad_scratch_.flat());
    be_.axpy(dembed.reshape({vocab * d}), embed_grad_f32_.flat(), 1.0);
  }
  src.grad_done(eu);
  return loss;
}

ops::LossSums LlamaModel::forward_loss(const std::vector<Tensor>& params, const Batch& b) {
  check_params(params, "parameter");
  Workspace& ws = workspace(b, false);
  VectorParamSource src(params, params);
  forward_trunk(src, b, ws, false);
  const int64_t n = b.tokens_count(), d = cfg_.hidden_size;
  return be_.lm_head_loss(ws.hf.view({n, d}), head_matrix(params), b.labels, opts_.lm_head_tile, 0.0, Tensor(),
                          Tensor());
}

ops::Tensor LlamaModel::forward_hidden(const std::vector<Tensor>& params, const Batch& b) {
  check_params(params, "parameter");
  Workspace& ws = workspace(b, false);
  VectorParamSource src(params, params);
  forward_trunk(src, b, ws, false);
  return ws.hf.view({b.tokens_count(), cfg_.hidden_size});
}

ops::LossSums LlamaModel::head_loss(const std::vector<Tensor>& params, const Tensor& hidden, const Tensor& labels) {
  check_params(params, "parameter");
  return be_.lm_head_loss(hidden, head_matrix(params), labels, opts_.lm_head_tile, 0.0, Tensor(), Tensor());
}

void LlamaModel::forward_logits(const std::vector<Tensor>& params, const Batch& b, const Tensor& logits) {
  check_params(params, "parameter");
  Workspace& ws = workspace(b, false);
  VectorParamSource src(params, params);
  forward_trunk(src, b, ws, false);
  const int64_t n = b.tokens_count(), d = cfg_.hidden_size, vocab = cfg_.vocab_size;
  be_.matmul(ws.hf.view({n, d}), false, head_matrix(params), true, logits.reshape({n, vocab}));
}

void LlamaModel::release_workspace() {
  ws_.reset();
  score_ws_.reset();
}

ModelOptions options_for(const StageConfig& cfg, bool device) {
  ModelOptions mo;
  mo.checkpoint = cfg.activation.checkpoint;
  mo.lm_head_tile = cfg.activation.lm_head_tile;
  mo.mlp_tile = cfg.activation.mlp_tile;
  mo.f32_grads = device;
  mo.offload_checkpoints = cfg.activation.offload == OffloadTarget::Cpu;
  mo.offload_layers = cfg.activation.offload_layers;
  mo.attention_output_layers = cfg.activation.attention_output_layers;
  mo.head_groups = cfg.activation.attention_head_groups;
  return mo;
}

}  // namespace easyctx::model
