// LlamaModel's forward-only evaluation path (forward_score): one layer's activations, the
// residual stream in place, the LM head on scored rows only (docs/architecture.md).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/llama.h"
#include "model/llama_workspace.h"

namespace easyctx::model {

using ops::Buffer;
using ops::Tensor;

template <class Visit>
void LlamaModel::visit_score_workspace(const LlamaConfig& c, const ModelOptions& o, DType dt, int64_t tokens,
                                       ScoreWorkspace* ws, Visit&& visit) {
  const int64_t n = tokens, d = c.hidden_size, ff = c.intermediate_size, mt = mlp_rows(o, n, false);
  const DType st = stat_dtype(dt);
  const char* mlp = mt == n ? "n x I" : "mlp_tile x I";
  visit(BufferSpec{"fwd.resid", dt, n * d, false, "n x D", "residual stream (in place)"}, ws ? &ws->x : nullptr);
  visit(BufferSpec{"fwd.h", dt, n * d, false, "n x D", "norm output / O projection"}, ws ? &ws->h : nullptr);
  visit(BufferSpec{"fwd.q", dt, n * c.q_dim(), false, "n x Hq x hd", "queries"}, ws ? &ws->q : nullptr);
  visit(BufferSpec{"fwd.k", dt, n * c.kv_dim(), false, "n x Hkv x hd", "keys"}, ws ? &ws->k : nullptr);
  visit(BufferSpec{"fwd.v", dt, n * c.kv_dim(), false, "n x Hkv x hd", "values"}, ws ? &ws->v : nullptr);
  visit(BufferSpec{"fwd.o", dt, n * c.q_dim(), false, "n x Hq x hd", "attention output"}, ws ? &ws->o : nullptr);
  visit(BufferSpec{"fwd.lse", st, n * c.num_heads, false, "B x Hq x S", "attention LSE"}, ws ? &ws->lse : nullptr);
  visit(BufferSpec{"fwd.rstd", st, n, false, "n", "norm rstd"}, ws ? &ws->rstd : nullptr);
  visit(BufferSpec{"fwd.g", dt, mt * ff, false, mlp, "gate projection"}, ws ? &ws->g : nullptr);
  visit(BufferSpec{"fwd.u", dt, mt * ff, false, mlp, "up projection"}, ws ? &ws->u : nullptr);
  visit(BufferSpec{"fwd.m", dt, mt * ff, false, mlp, "silu(gate) x up"}, ws ? &ws->m : nullptr);
  visit(BufferSpec{"fwd.down", dt, mt * d, false, mt == n ? "n x D" : "mlp_tile x D", "MLP output of one tile"},
        ws ? &ws->down : nullptr);
  if (c.qkv_bias)
    visit(BufferSpec{"fwd.ones", dt, n, false, "n", "ones (the q/k/v bias by matmul)"}, ws ? &ws->ones : nullptr);
  if (!c.qk_norm) return;
  visit(BufferSpec{"fwd.q_lin", dt, n * c.q_dim(), false, "n x Hq x hd", "queries before their norm"},
        ws ? &ws->q_lin : nullptr);
  visit(BufferSpec{"fwd.k_lin", dt, n * c.kv_dim(), false, "n x Hkv x hd", "keys before their norm"},
        ws ? &ws->k_lin : nullptr);
  visit(BufferSpec{"fwd.q_rstd", st, n * c.num_heads, false, "n x Hq", "query norm rstd"}, ws ? &ws->q_rstd : nullptr);
  visit(BufferSpec{"fwd.k_rstd", st, n * c.num_kv_heads, false, "n x Hkv", "key norm rstd"},
        ws ? &ws->k_rstd : nullptr);
}

std::vector<BufferSpec> LlamaModel::score_workspace_specs(const LlamaConfig& c, const ModelOptions& o, DType dtype,
                                                          int64_t batch, int64_t seq) {
  std::vector<BufferSpec> v;
  visit_score_workspace(c, o, dtype, batch * seq, nullptr, [&](const BufferSpec& s, Buffer*) { v.push_back(s); });
  return v;
}

// One layer, in place on ws.x: the ops of layer_forward in its order, on fewer buffers.
void LlamaModel::score_layer(const LayerParams& p, const Batch& b, ScoreWorkspace& ws) {
  auto W = [&](LayerTensor t) { return p.w[static_cast<size_t>(t)]; };
  const int64_t n = b.tokens_count(), d = cfg_.hidden_size, ff = cfg_.intermediate_size, hd = cfg_.head_dim;
  const int64_t hq = cfg_.num_heads, hkv = cfg_.num_kv_heads;
  const Tensor x = ws.x.view({n, d}), h = ws.h.view({n, d}), rstd = ws.rstd.view({n});
  const Tensor q = ws.q.view({n, hq * hd}), k = ws.k.view({n, hkv * hd}), v = ws.v.view({n, hkv * hd});
  const Tensor o = ws.o.view({n, hq * hd});
  be_.rmsnorm_fwd(x, W(kAttnNorm), cfg_.rms_norm_eps, h, rstd);
  QkvActs qa;
  qa.q = q;
  qa.k = k;
  qa.v = v;
  if (cfg_.qk_norm) {
    qa.q_lin = ws.q_lin.view({n, hq * hd});
    qa.k_lin = ws.k_lin.view({n, hkv * hd});
    qa.q_rstd = ws.q_rstd.view({n * hq});
    qa.k_rstd = ws.k_rstd.view({n * hkv});
  }
  project_qkv(h, qkv_weights(p, nullptr, n, 0, 1), qa, ws.ones, b);
  attn_->forward({q.reshape({b.batch, b.seq, hq, hd}), k.reshape({b.batch, b.seq, hkv, hd}),
                  v.reshape({b.batch, b.seq, hkv, hd}), o.reshape({b.batch, b.seq, hq, hd}),
                  ws.lse.view({b.batch, hq, b.seq}), attention_scale(), b.docs(), cfg_.window_of(p.layer)});
  be_.matmul(o, false, W(kO), true, h);  // the input norm's output is dead: h takes the projection
  be_.axpy(x, h, 1.0);                   // x_mid = x_in + o W_O^T
  be_.rmsnorm_fwd(x, W(kMlpNorm), cfg_.rms_norm_eps, h, rstd);
  const int64_t mt = std::min(mlp_rows(opts_, n, false), ws.g.numel() / ff);
  for (int64_t r0 = 0; r0 < n; r0 += mt) {
    const int64_t rows = std::min(mt, n - r0);
    const Tensor ht = h.rows(r0, rows), g = ws.g.view({rows, ff}), u = ws.u.view({rows, ff}), m = ws.m.view({rows, ff});
    const Tensor down = ws.down.view({rows, d});
    be_.matmul(ht, false, W(kGate), true, g);
    be_.matmul(ht, false, W(kUp), true, u);
    be_.swiglu_fwd(g, u, m);
    be_.matmul(m, false, W(kDown), true, down);
    be_.axpy(x.rows(r0, rows), down, 1.0);  // x_out = x_mid + MLP
  }
}

void LlamaModel::forward_score(const std::vector<Tensor>& params, const Batch& b, const Tensor& nll,
                               const Tensor& top) {
  check_params(params, "parameter");
  EASYCTX_CHECK(!layout_.lora().enabled(), "forward_score: a LoRA model (evaluations merge the adapter into the base)");
  EASYCTX_CHECK(b.batch > 0 && b.seq > 0, "LlamaModel: empty batch ", b.batch, "x", b.seq);
  const int64_t n = b.tokens_count(), d = cfg_.hidden_size, L = cfg_.num_layers;
  for (const Tensor* t : {&b.tokens, &b.positions, &b.labels})
    EASYCTX_CHECK(t->dtype == DType::I32 && t->numel() == n, "LlamaModel: batch arrays must be i32[", n, "], got ",
                  t->describe());
  EASYCTX_CHECK(nll.dtype == DType::F64 && nll.space == MemSpace::Host && nll.numel() == n,
                "forward_score: nll must be host f64[", n, "], got ", nll.describe());
  EASYCTX_CHECK(top.dtype == DType::I32 && top.space == MemSpace::Host && top.numel() == n,
                "forward_score: top must be host i32[", n, "], got ", top.describe());
  if (!score_ws_ || score_ws_->tokens < n) {
    score_ws_.reset();  // free first: peak memory is one workspace
    auto ws = std::make_unique<ScoreWorkspace>();
    ws->tokens = n;
    visit_score_workspace(cfg_, opts_, dtype_, n, ws.get(), [&](const BufferSpec& s, Buffer* slot) {
      *slot = be_.alloc(s.dtype, s.numel, s.name.c_str());
    });
    if (cfg_.qkv_bias) be_.fill(ws->ones.flat(), 1.0);
    score_ws_ = std::move(ws);
  }
  ScoreWorkspace& ws = *score_ws_;
  prepare_rope(b);
  be_.embedding_fwd(b.tokens, view_at(params, layout_.embedding()).reshape({cfg_.vocab_size, d}), ws.x.view({n, d}));
  for (int64_t l = 0; l < L; ++l)
    score_layer(layer_params(l, params[layout_.layer_unit(l)], Tensor(), Tensor(), Tensor()), b, ws);
  const Tensor h = ws.h.view({n, d});
  be_.rmsnorm_fwd(ws.x.view({n, d}), view_at(params, layout_.final_norm()), cfg_.rms_norm_eps, h, ws.rstd.view({n}));
  // The LM head on the runs of labelled rows only.
  std::vector<int32_t> labels(static_cast<size_t>(n));
  be_.copy(Tensor(labels.data(), DType::I32, {n}), b.labels);
  std::fill(nll.ptr<double>(), nll.ptr<double>() + n, 0.0);
  std::fill(top.ptr<int32_t>(), top.ptr<int32_t>() + n, 0);
  const Tensor head = head_matrix(params);
  for (int64_t r0 = 0; r0 < n;) {
    if (labels[static_cast<size_t>(r0)] < 0) {
      ++r0;
      continue;
    }
    int64_t r1 = r0 + 1;
    while (r1 < n && labels[static_cast<size_t>(r1)] >= 0) ++r1;
    be_.lm_head_score(h.rows(r0, r1 - r0), head, b.labels.reshape({n}).rows(r0, r1 - r0), opts_.lm_head_tile,
                      nll.reshape({n}).rows(r0, r1 - r0), top.reshape({n}).rows(r0, r1 - r0));
    r0 = r1;
  }
}

}  // namespace easyctx::model
