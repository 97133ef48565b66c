#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention/head_grouped.h"
#include "core/checked.h"
#include "core/error.h"
#include "model/activation_store.h"
#include "model/llama_workspace.h"

namespace easyctx::model {

const attention::DocumentStarts* Batch::docs() const {
  if (!documents) return nullptr;
  EASYCTX_CHECK(static_cast<int64_t>(documents->size()) == batch, "model batch: ", documents->size(),
                " document lists for ", batch, " sequences");
  return documents->data();
}

using ops::Buffer;
using ops::Tensor;

LlamaModel::LlamaModel(const LlamaConfig& cfg, ops::Backend& be, DType dtype, ModelOptions opts,
                       std::shared_ptr<attention::SequenceAttention> attn)
    : cfg_(cfg),
      layout_(cfg, opts.lora),
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
  EASYCTX_CHECK_INPUT(cfg_.sliding_window == 0 || be_.memspace() == MemSpace::Host || opts_.unchecked_device_window,
                      cfg_.name, ": sliding_window = ", cfg_.sliding_window,
                      ": sliding windows on CUDA are not enabled until their GPU check has passed "
                      "(train.device cpu runs it; docs/model.md, \"Sliding window\")");
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
  rope_length_ = cfg_.max_position_embeddings;  // (the table of every length up to it)
}

void LlamaModel::prepare_rope(const Batch& b) {
  if (!cfg_.dynamic_rope()) return;
  int64_t len = b.rope_length;
  if (len <= 0) {  // this rank's positions (a copy to the host, which waits for them)
    std::vector<int32_t> pos(static_cast<size_t>(b.positions.numel()));
    be_.copy(Tensor(pos.data(), DType::I32, {b.positions.numel()}), b.positions);
    len = pos.empty() ? 0 : int64_t{*std::max_element(pos.begin(), pos.end())} + 1;
  }
  len = std::max(len, cfg_.max_position_embeddings);  // one table for every length up to it
  if (len == rope_length_) return;
  // The copy is ordered after the work queued on the table so far (the backend's stream).
  std::vector<float> f = cfg_.inv_freq(len);
  be_.copy(inv_freq_.flat(), Tensor(f.data(), DType::F32, {static_cast<int64_t>(f.size())}));
  rope_length_ = len;
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
                  " unit ", layout_.units()[u].name, " is ", params[u].describe(), ", expected ", ops::type_name(want),
                  "[", layout_.units()[u].numel, "]");
  }
}

Tensor LlamaModel::view_at(const std::vector<Tensor>& units, const ParamLayout::Loc& loc) const {
  EASYCTX_CHECK(loc.found() && loc.unit < units.size() && !units[loc.unit].empty(), "LlamaModel: unit ", loc.unit,
                " not at hand");
  return tensor_view(units[loc.unit], loc.unit, loc.tensor);
}

// The LM-head matrix [V, D] inside `units` (parameters or gradients): lm_head.weight, or the
// embedding when tied.
Tensor LlamaModel::head_matrix(const std::vector<Tensor>& units) const {
  return view_at(units, layout_.lm_head()).reshape({cfg_.vocab_size, cfg_.hidden_size});
}

LayerParams LlamaModel::layer_params(int64_t l, const Tensor& w, const Tensor& wl, const Tensor& gw,
                                     const Tensor& gwl) const {
  const size_t ui = layout_.layer_unit(l);
  auto at = [&](const ParamLayout::Loc& loc, bool grad) {
    const Tensor& u = loc.unit == ui ? (grad ? gw : w) : (grad ? gwl : wl);
    return u.empty() ? Tensor() : tensor_view(u, loc.unit, loc.tensor);
  };
  LayerParams p;
  p.layer = l;
  for (int t = 0; t < kLayerTensors; ++t) {
    if (t > kMlpNorm && !(t <= kVBias ? cfg_.qkv_bias : cfg_.qk_norm)) continue;  // (absent from this model)
    const ParamLayout::Loc loc = layout_.layer_tensor(l, static_cast<LayerTensor>(t));
    p.w[static_cast<size_t>(t)] = at(loc, false);
    p.g[static_cast<size_t>(t)] = at(loc, true);
  }
  for (int t = 0; t < kLoraTargets; ++t) {
    const ParamLayout::Loc a = layout_.lora_matrix(l, t, true), b = layout_.lora_matrix(l, t, false);
    if (!a.found()) continue;
    const size_t k = static_cast<size_t>(t);
    p.a[k] = at(a, false);
    p.b[k] = at(b, false);
    p.ga[k] = at(a, true);
    p.gb[k] = at(b, true);
  }
  p.rank = layout_.lora().rank;
  p.scale = layout_.lora().enabled() ? layout_.lora().scale() : 0.0;
  return p;
}

// The model's own buffers for `dims`, in allocation order: visit(spec, slot), slot null when
// only planning (workspace_specs). The single source of truth for both the allocation and the
// memory plan (with ActivationStore::visit_inputs / visit_outputs for the checkpoints).
void LlamaModel::visit_workspace(const WorkspaceDims& dims, Workspace* ws, const BufferVisit& visit) {
  const LlamaConfig& c = dims.cfg;
  const ModelOptions& o = dims.opts;
  const int64_t n = dims.tokens(), d = c.hidden_size, ff = c.intermediate_size;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), G = o.head_groups, L = c.num_layers;
  const DType dt = dims.dtype, st = stat_dtype(dt);
  const bool keep_all = dims.backward && o.checkpoint == CheckpointPolicy::None;
  const int64_t mt = mlp_rows(o, n, keep_all);
  // Head groups: q, k, v, o, lse and the gradients for one group (checkpoint none: the layer's
  // activations for every group, group-major); the attention-output checkpoints stay whole.
  const int64_t per = keep_all ? 1 : G;  // acts hold 1/per of the heads
  const int64_t lse_n = dims.batch * c.num_heads * dims.seq;
  const bool part = per > 1, dpart = G > 1;
  const char* q_shape = part ? "n x Hq/G x hd" : "n x Hq x hd";
  const char* kv_shape = part ? "n x Hkv/G x hd" : "n x Hkv x hd";
  const char* mlp_shape = mt == n ? "n x I" : "mlp_tile x I";
  const size_t n_acts = keep_all ? static_cast<size_t>(L) : 1;
  if (ws) ws->acts.resize(n_acts);
  for (size_t i = 0; i < n_acts; ++i) {
    LayerActs* a = ws ? &ws->acts[i] : nullptr;
    const std::string p = "acts." + std::to_string(i) + ".";
    visit({p + "h1", dt, n * d, false, "n x D", "input norm output"}, a ? &a->h1 : nullptr);
    visit({p + "rstd1", st, n, false, "n", "input norm rstd"}, a ? &a->rstd1 : nullptr);
    visit({p + "q", dt, n * qd / per, false, q_shape, "queries after RoPE"}, a ? &a->q : nullptr);
    visit({p + "k", dt, n * kvd / per, false, kv_shape, "keys after RoPE"}, a ? &a->k : nullptr);
    visit({p + "v", dt, n * kvd / per, false, kv_shape, "values"}, a ? &a->v : nullptr);
    visit({p + "o", dt, n * qd / per, false, q_shape, "attention output"}, a ? &a->o : nullptr);
    visit({p + "lse", st, lse_n / per, false, part ? "B x Hq/G x S" : "B x Hq x S", "attention LSE"},
          a ? &a->lse : nullptr);
    if (c.qk_norm) {
      visit({p + "q_lin", dt, n * qd / per, false, q_shape, "queries before their norm"}, a ? &a->q_lin : nullptr);
      visit({p + "k_lin", dt, n * kvd / per, false, kv_shape, "keys before their norm"}, a ? &a->k_lin : nullptr);
      visit({p + "q_rstd", st, n * c.num_heads / per, false, part ? "n x Hq/G" : "n x Hq", "query norm rstd"},
            a ? &a->q_rstd : nullptr);
      visit({p + "k_rstd", st, n * c.num_kv_heads / per, false, part ? "n x Hkv/G" : "n x Hkv", "key norm rstd"},
            a ? &a->k_rstd : nullptr);
    }
    visit({p + "x_mid", dt, n * d, false, "n x D", "residual after attention"}, a ? &a->x_mid : nullptr);
    visit({p + "h2", dt, mt * d, false, mt == n ? "n x D" : "mlp_tile x D",
           mt == n ? "MLP norm output" : "MLP norm output (one tile's rows)"},
          a ? &a->h2 : nullptr);
    visit({p + "rstd2", st, n, false, "n", "MLP norm rstd"}, a ? &a->rstd2 : nullptr);
    visit({p + "g", dt, mt * ff, false, mlp_shape, "gate projection"}, a ? &a->g : nullptr);
    visit({p + "u", dt, mt * ff, false, mlp_shape, "up projection"}, a ? &a->u : nullptr);
    visit({p + "m", dt, mt * ff, false, mlp_shape, "silu(gate) x up"}, a ? &a->m : nullptr);
    visit_lora_acts(dims, p, mt, a, visit);
  }
  // head_in (the final norm's output) is dead once the head's backward has run: it doubles as
  // the attention-output gradient.
  const int64_t head_w = dims.backward ? std::max(d, qd / G) : d;
  visit({"head_in", dt, n * head_w, false,
         !dims.backward ? "n x D"
         : dpart        ? "n x max(D, Hq/G x hd)"
                        : "n x max(D, Hq x hd)",
         dims.backward ? "final norm output, then the attention-output gradient" : "final norm output"},
        ws ? &ws->head_in : nullptr);
  visit({"rstd_f", st, n, false, "n", "final norm rstd"}, ws ? &ws->rstd_f : nullptr);
  if (c.qkv_bias) visit({"ones", dt, n, false, "n", "ones (the q/k/v bias by matmul)"}, ws ? &ws->ones : nullptr);
  if (G > 1) visit({"wo_g", dt, d * qd / G, false, "D x Hq/G x hd", "one group's W_O columns"}, ws ? &ws->wo : nullptr);
  if (!dims.backward) return visit_lora_workspace(dims, ws, visit);
  const DType gt = o.f32_grads ? DType::F32 : dt;
  const char* dq_shape = dpart ? "n x Hq/G x hd" : "n x Hq x hd";
  const char* dkv_shape = dpart ? "n x Hkv/G x hd" : "n x Hkv x hd";
  if (G > 1)
    visit({"dwo_g", gt, d * qd / G, false, "D x Hq/G x hd", "one group's W_O gradient"}, ws ? &ws->dwo : nullptr);
  visit({"dx", dt, n * d, false, "n x D", "residual gradient"}, ws ? &ws->dx : nullptr);
  visit({"dh", dt, n * d, false, "n x D", "projection input gradient"}, ws ? &ws->dh : nullptr);
  visit({"dm", dt, mt * ff, false, mlp_shape, "MLP gradient"}, ws ? &ws->dm : nullptr);
  visit({"dg", dt, mt * ff, false, mlp_shape, "gate gradient"}, ws ? &ws->dg : nullptr);
  visit({"du", dt, mt * ff, false, mlp_shape, "up gradient"}, ws ? &ws->du : nullptr);
  visit({"dq", dt, n * qd / G, false, dq_shape, "query gradient"}, ws ? &ws->dq : nullptr);
  visit({"dk", dt, n * kvd / G, false, dkv_shape, "key gradient"}, ws ? &ws->dk : nullptr);
  visit({"dv", dt, n * kvd / G, false, dkv_shape, "value gradient"}, ws ? &ws->dv : nullptr);
  visit_lora_workspace(dims, ws, visit);
}

// LoRA: one layer's adapter inputs x A^T (acts prefix p: "acts.3.").
void LlamaModel::visit_lora_acts(const WorkspaceDims& dims, const std::string& p, int64_t mt, LayerActs* a,
                                 const BufferVisit& visit) {
  const LoraSpec& lo = dims.opts.lora;
  const int64_t n = dims.tokens();
  for (int t = 0; t < kLoraTargets; ++t) {
    if (!lo.enabled() || !lo.targets[static_cast<size_t>(t)]) continue;
    const bool mlp = t >= kLoraGate;
    visit({p + "lora_" + lora_target_name(t), dims.dtype, (mlp ? mt : n) * lo.rank, false,
           mlp && mt != n ? "mlp_tile x r" : "n x r", std::string("LoRA input of ") + lora_target_name(t)},
          a ? &a->lora_t[static_cast<size_t>(t)] : nullptr);
  }
}

// LoRA: the tiled attention's packed A_o columns (and their gradient), the backward's dy B.
void LlamaModel::visit_lora_workspace(const WorkspaceDims& dims, Workspace* ws, const BufferVisit& visit) {
  const LoraSpec& lo = dims.opts.lora;
  if (!lo.enabled()) return;
  const int64_t n = dims.tokens(), G = dims.opts.head_groups, part = lo.rank * dims.cfg.q_dim() / G;
  const DType dt = dims.dtype, gt = dims.opts.f32_grads ? DType::F32 : dt;
  const bool packed_o = lo.targets[kLoraO] && G > 1;
  if (packed_o)
    visit({"lora_ao_g", dt, part, false, "r x Hq/G x hd", "one group's A_o columns (LoRA)"},
          ws ? &ws->lora_ao : nullptr);
  if (!dims.backward) return;
  if (packed_o)
    visit({"lora_dao_g", gt, part, false, "r x Hq/G x hd", "one group's A_o gradient (LoRA)"},
          ws ? &ws->lora_dao : nullptr);
  for (size_t k = 0; k < 4; ++k)
    visit({"lora_u." + std::to_string(k), dt, n * lo.rank, false, "n x r", "LoRA output gradient x B"},
          ws ? &ws->lora_u[k] : nullptr);
}

// Rows per MLP tile: activation.mlp_tile when it splits the tokens and the layer is
// recomputed in backward (with checkpoint none every layer keeps its whole MLP activations).
int64_t LlamaModel::mlp_rows(const ModelOptions& o, int64_t n, bool keep_all) {
  return (!keep_all && o.mlp_tile > 0 && o.mlp_tile < n) ? o.mlp_tile : n;
}

namespace {

// Every product the workspace takes is at most tokens x max(hidden, q, intermediate, heads)
// or a head tile of logits: checked once here (InputError naming the sizes), plain afterwards.
void check_workspace(const WorkspaceDims& dims) {
  const std::string what = "the model's workspace for a micro-batch of " + std::to_string(dims.batch) + " x " +
                           std::to_string(dims.seq) + " tokens";
  dims.cfg.check_tokens(checked_elements({dims.batch, dims.seq}, what), dims.opts.lm_head_tile, what);
  EASYCTX_CHECK(!(dims.backward && dims.opts.offload_checkpoints && dims.opts.checkpoint == CheckpointPolicy::None),
                "LlamaModel: offload_checkpoints needs checkpoint policy Layer or AttentionOutput "
                "(activation.checkpoint layer or attention_output)");
  EASYCTX_CHECK_INPUT(dims.opts.head_groups >= 1 && dims.cfg.num_kv_heads % dims.opts.head_groups == 0,
                      "activation.attention_head_groups: ", dims.opts.head_groups,
                      " does not divide the model's key/value heads (", dims.cfg.num_kv_heads, ")");
}

}  // namespace

std::vector<BufferSpec> LlamaModel::workspace_specs(const LlamaConfig& c, const ModelOptions& o, DType dtype,
                                                    int64_t batch, int64_t seq, bool backward) {
  const WorkspaceDims dims{c, o, dtype, batch, seq, backward};
  check_workspace(dims);
  std::vector<BufferSpec> v;
  const BufferVisit add = [&](const BufferSpec& s, Buffer*) { v.push_back(s); };
  ActivationStore::visit_inputs(dims, nullptr, add);
  visit_workspace(dims, nullptr, add);
  ActivationStore::visit_outputs(dims, nullptr, add);
  const DType gt = o.f32_grads ? DType::F32 : dtype;
  const bool embed_trains = !o.lora.enabled() || o.lora.embed_tokens;  // (LoRA's frozen embedding: no backward)
  if (backward && gt != dtype && embed_trains) {  // the embedding backward's scratch (kept across steps)
    v.push_back({"embed_grad_scratch", dtype, c.vocab_size * c.hidden_size, false, "V x D",
                 "embedding-gradient scratch (bf16, f32_grads)"});
    v.push_back({"embed_grad_f32", DType::F32, c.vocab_size * c.hidden_size, false, "V x D",
                 "embedding-gradient scratch (f32 copy)"});
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
  store_.reset();
  const WorkspaceDims dims{cfg_, opts_, dtype_, b.batch, b.seq, for_backward};
  check_workspace(dims);
  auto ws = std::make_unique<Workspace>();
  ws->batch = b.batch;
  ws->seq = b.seq;
  ws->backward = for_backward;
  store_ = std::make_unique<ActivationStore>(be_, dims);
  visit_workspace(dims, ws.get(), [&](const BufferSpec& s, Buffer* slot) { *slot = be_.alloc(s.dtype, s.numel); });
  if (cfg_.qkv_bias) be_.fill(ws->ones.flat(), 1.0);
  ws_ = std::move(ws);
  return *ws_;
}

// Rows [r0, r0 + rows) of the MLP's input norm (h2, rstd2) from x_mid, into the tile-sized h2:
// RMSNorm is row by row, so these are the rows the whole-sequence norm would give.
Tensor LlamaModel::mlp_norm_tile(const Tensor& norm, LayerActs& a, const Tensor& x_mid, int64_t r0, int64_t rows) {
  const int64_t d = cfg_.hidden_size, n = x_mid.numel() / d;
  const Tensor h2t = a.h2.flat().slice_flat(0, {rows, d});
  be_.rmsnorm_fwd(x_mid.rows(r0, rows), norm, cfg_.rms_norm_eps, h2t, a.rstd2.view({n}).rows(r0, rows));
  return h2t;
}

Tensor LlamaModel::lora_in(LayerActs& a, int target, int64_t rows, int64_t rank) {
  return a.lora_t[static_cast<size_t>(target)].view({rows, rank});
}

void LlamaModel::mlp_tile_forward(const LayerParams& p, LayerActs& a, const Tensor& h2t, int64_t rows,
                                  const Tensor& out) {
  const int64_t ff = cfg_.intermediate_size, r = p.rank;
  const Tensor g = a.g.view({rows, ff}), u = a.u.view({rows, ff}), m = a.m.view({rows, ff});
  be_.matmul(h2t, false, p.w[kGate], true, g);
  if (p.lora(kLoraGate)) lora_forward(h2t, p, kLoraGate, lora_in(a, kLoraGate, rows, r), g);
  be_.matmul(h2t, false, p.w[kUp], true, u);
  if (p.lora(kLoraUp)) lora_forward(h2t, p, kLoraUp, lora_in(a, kLoraUp, rows, r), u);
  be_.swiglu_fwd(g, u, m);
  if (out.empty()) {  // (the backward's recompute: only the down adapter's input)
    if (p.lora(kLoraDown)) be_.matmul(m, false, p.a[kLoraDown], true, lora_in(a, kLoraDown, rows, r));
    return;
  }
  be_.matmul(m, false, p.w[kDown], true, out);
  if (p.lora(kLoraDown)) lora_forward(m, p, kLoraDown, lora_in(a, kLoraDown, rows, r), out);
}

// dxt: the gradient of the tile's output; dht receives its input's (h2t's). A frozen weight
// (empty gradient) gets none: a third of the matmuls of its backward skipped.
void LlamaModel::mlp_tile_backward(const LayerParams& p, LayerActs& a, Workspace& ws, const Tensor& h2t,
                                   const Tensor& dxt, const Tensor& dht, int64_t rows) {
  const int64_t ff = cfg_.intermediate_size, r = p.rank;
  const Tensor g = a.g.view({rows, ff}), u = a.u.view({rows, ff}), m = a.m.view({rows, ff});
  const Tensor dm = ws.dm.view({rows, ff}), dg = ws.dg.view({rows, ff}), du = ws.du.view({rows, ff});
  const Tensor scratch = p.rank > 0 ? ws.lora_u[0].flat().slice_flat(0, {rows, r}) : Tensor();
  be_.matmul(dxt, false, p.w[kDown], false, dm);
  if (p.lora(kLoraDown)) lora_backward(m, dxt, p, kLoraDown, lora_in(a, kLoraDown, rows, r), scratch, dm);
  if (!p.g[kDown].empty()) be_.matmul(dxt, true, m, false, p.g[kDown], 1.0, 1.0);
  be_.swiglu_bwd(g, u, dm, dg, du);
  be_.matmul(dg, false, p.w[kGate], false, dht);
  be_.matmul(du, false, p.w[kUp], false, dht, 1.0, 1.0);
  if (p.lora(kLoraGate)) lora_backward(h2t, dg, p, kLoraGate, lora_in(a, kLoraGate, rows, r), scratch, dht);
  if (p.lora(kLoraUp)) lora_backward(h2t, du, p, kLoraUp, lora_in(a, kLoraUp, rows, r), scratch, dht);
  if (!p.g[kGate].empty()) be_.matmul(dg, true, h2t, false, p.g[kGate], 1.0, 1.0);
  if (!p.g[kUp].empty()) be_.matmul(du, true, h2t, false, p.g[kUp], 1.0, 1.0);
}

// saved.restored: a.o and a.lse (or, head groups, saved's checkpoint) already hold this
// layer's attention (the attention_output checkpoint), so the recompute skips the attention
// itself. x_out empty (the backward's recompute) stops at h2: the MLP is recomputed tile by
// tile in layer_backward, and the layer output is not needed there.
void LlamaModel::layer_forward(const LayerParams& p, const Tensor& x_in, const Tensor& x_out, const Batch& b,
                               LayerActs& a, Workspace& ws, const SavedAttention& saved) {
  const int64_t n = b.tokens_count(), d = cfg_.hidden_size, ff = cfg_.intermediate_size, hd = cfg_.head_dim;
  const int64_t hq = cfg_.num_heads, hkv = cfg_.num_kv_heads;
  const Tensor h1 = a.h1.view({n, d}), x_mid = a.x_mid.view({n, d});
  be_.rmsnorm_fwd(x_in, p.w[kAttnNorm], cfg_.rms_norm_eps, h1, a.rstd1.view({n}));
  lora_qkv_inputs(h1, p, a);
  if (opts_.head_groups > 1) {
    attention_forward_grouped(p, h1, b, a, ws, x_mid, saved);
  } else {
    const QkvActs qa = qkv_acts(a, n, 0, 1);
    const Tensor &q = qa.q, &k = qa.k, &v = qa.v, o = a.o.view({n, hq * hd});
    project_qkv(h1, qkv_weights(p, &a, n, 0, 1), qa, ws.ones, b);
    if (!saved.restored)
      attn_->forward({q.reshape({b.batch, b.seq, hq, hd}), k.reshape({b.batch, b.seq, hkv, hd}),
                      v.reshape({b.batch, b.seq, hkv, hd}), o.reshape({b.batch, b.seq, hq, hd}),
                      a.lse.view({b.batch, hq, b.seq}), attention_scale(), b.docs(), cfg_.window_of(p.layer)});
    be_.matmul(o, false, p.w[kO], true, x_mid);
    if (p.lora(kLoraO)) lora_forward(o, p, kLoraO, lora_in(a, kLoraO, n, p.rank), x_mid);
  }
  be_.axpy(x_mid, x_in, 1.0);
  // MLP, a tile of rows at a time (one tile unless activation.mlp_tile splits the tokens). Its
  // input norm is row by row, so with tiles h2 holds one tile's rows, normed per tile here and
  // again in layer_backward (the same rows, the same values): one [n, D] buffer fewer.
  const int64_t mt = a.g.numel() / ff;
  const bool tiled = mt < n;
  if (!tiled) be_.rmsnorm_fwd(x_mid, p.w[kMlpNorm], cfg_.rms_norm_eps, a.h2.view({n, d}), a.rstd2.view({n}));
  if (x_out.empty()) return;
  for (int64_t r0 = 0; r0 < n; r0 += mt) {
    const int64_t rows = std::min(mt, n - r0);
    const Tensor h2t = tiled ? mlp_norm_tile(p.w[kMlpNorm], a, x_mid, r0, rows) : a.h2.view({n, d}).rows(r0, rows);
    mlp_tile_forward(p, a, h2t, rows, x_out.rows(r0, rows));
  }
  be_.axpy(x_out, x_mid, 1.0);
}

// dx: gradient w.r.t. the layer output on entry, w.r.t. the layer input on return. With a
// recomputing checkpoint policy a.g/u/m do not hold this layer's MLP activations (the layer
// was recomputed without its MLP): they are recomputed tile by tile here.
void LlamaModel::layer_backward(const LayerParams& p, const Tensor& x_in, const Batch& b, LayerActs& a, Workspace& ws,
                                const Tensor& dx, const SavedAttention& saved) {
  const int64_t n = b.tokens_count(), d = cfg_.hidden_size, ff = cfg_.intermediate_size;
  // MLP: x_out = x_mid + down(silu(gate(h2)) * up(h2)), a tile of rows at a time (tiles: h2
  // and rstd2 normed again per tile, as in layer_forward).
  const Tensor dh = ws.dh.view({n, d}), x_mid = a.x_mid.view({n, d});
  const int64_t mt = a.g.numel() / ff;
  const bool tiled = mt < n, recompute_mlp = opts_.checkpoint != CheckpointPolicy::None;
  for (int64_t r0 = 0; r0 < n; r0 += mt) {
    const int64_t rows = std::min(mt, n - r0);
    const Tensor h2t = tiled ? mlp_norm_tile(p.w[kMlpNorm], a, x_mid, r0, rows) : a.h2.view({n, d}).rows(r0, rows);
    if (recompute_mlp) mlp_tile_forward(p, a, h2t, rows, Tensor());
    mlp_tile_backward(p, a, ws, h2t, dx.rows(r0, rows), dh.rows(r0, rows), rows);
  }
  be_.rmsnorm_bwd(a.x_mid.view({n, d}), p.w[kMlpNorm], a.rstd2.view({n}), dh, dx, p.g[kMlpNorm]);
  if (opts_.head_groups > 1) attention_backward_grouped(p, b, a, ws, dx, saved);
  else attention_backward(p, b, a, ws, dx);
  be_.rmsnorm_bwd(x_in, p.w[kAttnNorm], a.rstd1.view({n}), dh, dx, p.g[kAttnNorm]);
}

// Attention: x_mid = x_in + o_proj(attn(rope(q), rope(k), v)); dx holds x_mid's gradient.
void LlamaModel::attention_backward(const LayerParams& p, const Batch& b, LayerActs& a, Workspace& ws,
                                    const Tensor& dx) {
  const int64_t n = b.tokens_count(), d = cfg_.hidden_size, hd = cfg_.head_dim, r = p.rank;
  const int64_t hq = cfg_.num_heads, hkv = cfg_.num_kv_heads;
  const Tensor dattn = ws.head_in.view({n, hq * hd}), dq = ws.dq.view({n, hq * hd}), dh = ws.dh.view({n, d});
  const Tensor dk = ws.dk.view({n, hkv * hd}), dv = ws.dv.view({n, hkv * hd}), h1 = a.h1.view({n, d});
  const Tensor o = a.o.view({n, hq * hd}), u = r > 0 ? ws.lora_u[0].view({n, r}) : Tensor();
  be_.matmul(dx, false, p.w[kO], false, dattn);
  if (p.lora(kLoraO)) lora_backward(o, dx, p, kLoraO, lora_in(a, kLoraO, n, r), u, dattn);
  if (!p.g[kO].empty()) be_.matmul(dx, true, o, false, p.g[kO], 1.0, 1.0);
  attn_->backward({a.q.view({b.batch, b.seq, hq, hd}), a.k.view({b.batch, b.seq, hkv, hd}),
                   a.v.view({b.batch, b.seq, hkv, hd}), a.o.view({b.batch, b.seq, hq, hd}),
                   a.lse.view({b.batch, hq, b.seq}), attention_scale(), b.docs(), cfg_.window_of(p.layer)},
                  {dattn.reshape({b.batch, b.seq, hq, hd}), dq.reshape({b.batch, b.seq, hq, hd}),
                   dk.reshape({b.batch, b.seq, hkv, hd}), dv.reshape({b.batch, b.seq, hkv, hd})});
  qkv_backward(qkv_weights(p, &a, n, 0, 1), qkv_weights(p, &a, n, 0, 1, true), qkv_acts(a, n, 0, 1), dq, dk, dv,
               ws.head_in.flat(), ws.ones, b);
  be_.matmul(dq, false, p.w[kQ], false, dh);
  be_.matmul(dk, false, p.w[kK], false, dh, 1.0, 1.0);
  be_.matmul(dv, false, p.w[kV], false, dh, 1.0, 1.0);
  const Tensor* dys[3] = {&dq, &dk, &dv};
  for (int t = kLoraQ; t <= kLoraV; ++t)
    if (p.lora(t)) lora_backward(h1, *dys[t], p, t, lora_in(a, t, n, r), u, dh);
  if (!p.g[kQ].empty()) be_.matmul(dq, true, h1, false, p.g[kQ], 1.0, 1.0);
  if (!p.g[kK].empty()) be_.matmul(dk, true, h1, false, p.g[kK], 1.0, 1.0);
  if (!p.g[kV].empty()) be_.matmul(dv, true, h1, false, p.g[kV], 1.0, 1.0);
}

// Embedding and every layer; fills the residual stream (and every layer's acts when kept),
// the store keeping each layer's checkpoints on the way.
void LlamaModel::forward_trunk(ParamSource& src, const Batch& b, Workspace& ws, bool keep) {
  const int64_t n = b.tokens_count(), d = cfg_.hidden_size, L = cfg_.num_layers;
  const ParamLayout::Loc em = layout_.embedding(), fn = layout_.final_norm();
  ActivationStore& store = *store_;
  store.begin();
  const Tensor eu = checked(src.acquire(em.unit), em.unit, dtype_, "parameter");
  be_.embedding_fwd(b.tokens, tensor_view(eu, em.unit, em.tensor).reshape({cfg_.vocab_size, d}), store.input(0));
  src.release(em.unit);
  for (int64_t l = 0; l < L; ++l) {
    LayerActs& a = ws.acts[keep ? static_cast<size_t>(l) : 0];
    const size_t ui = layout_.layer_unit(l), li = layout_.lora_unit(l);
    store.make_room(l);
    const Tensor w = checked(src.acquire(ui), ui, dtype_, "parameter");
    const Tensor wl = li == ParamLayout::kNone ? Tensor() : checked(src.acquire(li), li, dtype_, "parameter");
    layer_forward(layer_params(l, w, wl, Tensor(), Tensor()), store.input(l), store.input(l + 1), b, a, ws,
                  store.output_target(l));
    src.release(ui);
    if (li != ParamLayout::kNone) src.release(li);
    store.save(l, a.o.flat(), a.lse.flat());
  }
  const Tensor head = checked(src.acquire(fn.unit), fn.unit, dtype_, "parameter");
  be_.rmsnorm_fwd(store.input(L), tensor_view(head, fn.unit, fn.tensor), cfg_.rms_norm_eps, ws.head_in.view({n, d}),
                  ws.rstd_f.view({n}));
  src.release(fn.unit);
}

Tensor LlamaModel::checked(const Tensor& t, size_t u, DType want, const char* what) const {
  EASYCTX_CHECK(t.numel() == layout_.units()[u].numel && t.dtype == want, "LlamaModel: ", what, " unit ",
                layout_.units()[u].name, " is ", t.describe(), ", expected ", ops::type_name(want), "[",
                layout_.units()[u].numel, "]");
  return t;
}

// The units the head reads: the final norm's, then the LM head's (the embedding when tied).
std::vector<size_t> LlamaModel::head_units() const {
  std::vector<size_t> h{layout_.final_norm().unit};
  if (layout_.lm_head().unit != h[0]) h.push_back(layout_.lm_head().unit);
  return h;
}

std::vector<size_t> LlamaModel::acquire_order() const {
  std::vector<size_t> v{layout_.embedding().unit};
  auto layer = [&](int64_t l) {
    v.push_back(layout_.layer_unit(l));
    if (layout_.lora_unit(l) != ParamLayout::kNone) v.push_back(layout_.lora_unit(l));
  };
  for (int64_t l = 0; l < cfg_.num_layers; ++l) layer(l);
  v.push_back(layout_.final_norm().unit);
  for (size_t u : head_units()) v.push_back(u);
  for (int64_t l = cfg_.num_layers - 1; l >= 0; --l) layer(l);
  return v;
}

ops::LossSums LlamaModel::forward_backward(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                           const Batch& b, double grad_scale) {
  check_params(params, "parameter");
  check_grads(grads);
  VectorParamSource src(params, grads);
  return forward_backward(src, b, grad_scale);
}

ops::LossSums LlamaModel::forward_backward(ParamSource& src, const Batch& b, double grad_scale) {
  Workspace& ws = workspace(b, true);
  prepare_rope(b);
  ActivationStore& store = *store_;
  const bool keep = opts_.checkpoint == CheckpointPolicy::None;
  src.begin(acquire_order());
  forward_trunk(src, b, ws, keep);
  Tensor embed_grad;  // (the embedding's gradient is fetched once, with the head's: ParamSource order)
  const ops::LossSums loss = head_backward(src, b, ws, grad_scale, embed_grad);
  const Tensor dx = ws.dx.view({b.tokens_count(), cfg_.hidden_size});
  for (int64_t l = cfg_.num_layers - 1; l >= 0; --l) {
    store.prefetch(l);  // ready: layer l's checkpoints on the device
    const size_t ui = layout_.layer_unit(l), li = layout_.lora_unit(l);
    const bool lora = li != ParamLayout::kNone;
    const Tensor w = checked(src.acquire(ui), ui, dtype_, "parameter");
    const Tensor wl = lora ? checked(src.acquire(li), li, dtype_, "parameter") : Tensor();
    const Tensor gw = frozen(ui) ? Tensor() : checked(src.grad(ui), ui, grad_dtype_, "gradient");
    const Tensor gwl = lora ? checked(src.grad(li), li, grad_dtype_, "gradient") : Tensor();
    const LayerParams p = layer_params(l, w, wl, gw, gwl);
    LayerActs& a = ws.acts[keep ? static_cast<size_t>(l) : 0];
    const SavedAttention saved = keep ? SavedAttention{} : store.attention_output(l, a.o.flat(), a.lse.flat());
    if (!keep) layer_forward(p, store.input(l), Tensor(), b, a, ws, saved);  // recompute from the checkpoint
    layer_backward(p, store.input(l), b, a, ws, dx, saved);
    src.release(ui);
    if (lora) src.release(li);
    if (!frozen(ui)) src.grad_done(ui);
    if (lora) src.grad_done(li);
  }
  embedding_backward(src, b, ws, embed_grad);
  return loss;
}

// The gradients of the units the head reads that train (a frozen one gets none: empty views).
ops::LossSums LlamaModel::head_backward(ParamSource& src, const Batch& b, Workspace& ws, double grad_scale,
                                        Tensor& embed_grad) {
  const int64_t n = b.tokens_count(), d = cfg_.hidden_size;
  const size_t eu = layout_.embedding().unit;
  const Tensor dx = ws.dx.view({n, d}), dhf = ws.dh.view({n, d});
  std::vector<Tensor> params(layout_.num_units()), grads(layout_.num_units());
  const std::vector<size_t> units = head_units();
  for (size_t u : units) params[u] = checked(src.acquire(u), u, dtype_, "parameter");
  for (size_t u : units)
    if (!frozen(u)) grads[u] = checked(src.grad(u), u, grad_dtype_, "gradient");
  if (!frozen(eu) && grads[eu].empty()) grads[eu] = checked(src.grad(eu), eu, grad_dtype_, "gradient");
  auto grad_at = [&](const ParamLayout::Loc& loc) { return frozen(loc.unit) ? Tensor() : view_at(grads, loc); };
  const Tensor dw = grad_at(layout_.lm_head());
  const ops::LossSums loss =
      be_.lm_head_loss(ws.head_in.view({n, d}), head_matrix(params), b.labels, opts_.lm_head_tile, grad_scale, dhf,
                       dw.empty() ? dw : dw.reshape({cfg_.vocab_size, d}));
  be_.fill(dx, 0.0);
  be_.rmsnorm_bwd(store_->input(cfg_.num_layers), view_at(params, layout_.final_norm()), ws.rstd_f.view({n}), dhf, dx,
                  grad_at(layout_.final_norm()));
  for (auto it = units.rbegin(); it != units.rend(); ++it) src.release(*it);
  for (size_t u : units)
    if (!frozen(u) && u != eu) src.grad_done(u);
  embed_grad = grads[eu];
  return loss;
}

void LlamaModel::embedding_backward(ParamSource& src, const Batch& b, Workspace& ws, const Tensor& eg) {
  const int64_t n = b.tokens_count(), d = cfg_.hidden_size, vocab = cfg_.vocab_size;
  const ParamLayout::Loc em = layout_.embedding();
  if (frozen(em.unit)) return;  // (LoRA's frozen embedding: no gradient)
  const Tensor dx = ws.dx.view({n, d});
  const Tensor dembed = tensor_view(eg, em.unit, em.tensor).reshape({vocab, d});
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
  src.grad_done(em.unit);
}

ops::LossSums LlamaModel::forward_loss(const std::vector<Tensor>& params, const Batch& b) {
  check_params(params, "parameter");
  Workspace& ws = workspace(b, false);
  prepare_rope(b);
  VectorParamSource src(params, params);
  forward_trunk(src, b, ws, false);
  const int64_t n = b.tokens_count(), d = cfg_.hidden_size;
  return be_.lm_head_loss(ws.head_in.view({n, d}), head_matrix(params), b.labels, opts_.lm_head_tile, 0.0, Tensor(),
                          Tensor());
}

ops::Tensor LlamaModel::forward_hidden(const std::vector<Tensor>& params, const Batch& b) {
  check_params(params, "parameter");
  Workspace& ws = workspace(b, false);
  prepare_rope(b);
  VectorParamSource src(params, params);
  forward_trunk(src, b, ws, false);
  return ws.head_in.view({b.tokens_count(), cfg_.hidden_size});
}

ops::LossSums LlamaModel::head_loss(const std::vector<Tensor>& params, const Tensor& hidden, const Tensor& labels) {
  check_params(params, "parameter");
  return be_.lm_head_loss(hidden, head_matrix(params), labels, opts_.lm_head_tile, 0.0, Tensor(), Tensor());
}

void LlamaModel::forward_logits(const std::vector<Tensor>& params, const Batch& b, const Tensor& logits) {
  check_params(params, "parameter");
  Workspace& ws = workspace(b, false);
  prepare_rope(b);
  VectorParamSource src(params, params);
  forward_trunk(src, b, ws, false);
  const int64_t n = b.tokens_count(), d = cfg_.hidden_size, vocab = cfg_.vocab_size;
  be_.matmul(ws.head_in.view({n, d}), false, head_matrix(params), true, logits.reshape({n, vocab}));
}

void LlamaModel::release_workspace() {
  ws_.reset();
  store_.reset();
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
  mo.lora = lora_spec(cfg.lora);
  return mo;
}

}  // namespace easyctx::model
