// The layer's attention block tiled over head groups (ModelOptions::head_groups,
// activation.attention_head_groups), forward and backward; the rest of the layer is in llama.cpp.
#include <cmath>

#include "core/checked.h"
#include "core/error.h"
#include "model/activation_store.h"
#include "model/llama.h"
#include "model/llama_workspace.h"

namespace easyctx::model {

using ops::Buffer;
using ops::Tensor;

// The attention block in G head groups: group g's query heads [g Hq/G, (g+1) Hq/G) read only
// its key/value heads [g Hkv/G, (g+1) Hkv/G) (query head h uses kv head h / (Hq/Hkv)), so each
// group is a self-contained attention over rows of W_Q, W_K, W_V (contiguous) and the matching
// columns of W_O (packed into ws.wo: one copy_2d). The output projection accumulates the
// groups' partial sums into x_mid in group order (beta = 1 after the first): on the CPU GEMM,
// which adds its kKC = 256 deep blocks into C in order, that is the untiled sum bit for bit
// whenever Hq/G x hd is a multiple of 256 (else within rounding).
// saved.restored (attention_output's recompute): o comes from the checkpoint and q, k, v are
// not recomputed (the backward recomputes each group's). A checkpoint that is not restored
// (the training forward): each group's o and LSE are copied to their place in it (streamed:
// through a device slot of the store on to the layer's host buffers).
// LoRA on o_proj: its input t_o = o A_o^T sums the groups' o_g A_o,g^T (A_o's columns of the
// group, packed), and x_mid gets scale t_o B_o^T once every group is in.
void LlamaModel::attention_forward_grouped(const LayerParams& p, const Tensor& h1, const Batch& b, LayerActs& a,
                                           Workspace& ws, const Tensor& x_mid, const SavedAttention& saved) {
  const int64_t n = b.tokens_count(), d = cfg_.hidden_size, hd = cfg_.head_dim, G = opts_.head_groups;
  const int64_t hq = cfg_.num_heads / G, hkv = cfg_.num_kv_heads / G, qd = hq * hd;
  const int64_t lse_n = b.batch * hq * b.seq;
  const double scale = attention_scale();
  const Tensor wo = ws.wo.view({d, qd}), Wo = p.w[kO].reshape({d * G * qd});
  const Tensor &saved_o = saved.o, &saved_lse = saved.lse;
  const Tensor t_o = p.lora(kLoraO) ? a.lora_t[kLoraO].view({n, p.rank}) : Tensor();
  ActivationStore& store = *store_;
  const bool streamed = store.streams_outputs() && !saved_o.empty();
  for (int64_t g = 0; g < G; ++g) {
    Tensor o = group_part(a.o, g, G, n * qd);
    if (saved.restored) {
      o = streamed ? store.fetch_group(saved_o, saved_lse, g, G, false).o : group_part(saved_o, g, n * qd);
    } else {
      const QkvActs qa = qkv_acts(a, n, g, G);
      const Tensor &q = qa.q, &k = qa.k, &v = qa.v;
      Tensor lse = group_part(a.lse, g, G, lse_n);
      ActivationStore::GroupSlot slot;
      if (streamed) {  // o and LSE straight into a device slot, which then leaves for the host
        slot = store.next_group_slot();
        o = slot.o;
        lse = slot.lse;
      }
      project_qkv(h1, qkv_weights(p, &a, n, g, G), qa, ws.ones, b);
      group_attn_->forward({q.reshape({b.batch, b.seq, hq, hd}), k.reshape({b.batch, b.seq, hkv, hd}),
                            v.reshape({b.batch, b.seq, hkv, hd}), o.reshape({b.batch, b.seq, hq, hd}),
                            lse.reshape({b.batch, hq, b.seq}), scale, b.docs(), cfg_.window_of(p.layer)});
      if (streamed) {
        store.send_group(slot, group_part(saved_o, g, n * qd), group_part(saved_lse, g, lse_n));
      } else if (!saved_o.empty()) {
        be_.copy(group_part(saved_o, g, n * qd), o);
        be_.copy(group_part(saved_lse, g, lse_n), lse);
      }
    }
    be_.copy_2d(wo, qd, Wo.slice_flat(g * qd, {Wo.numel() - g * qd}), G * qd, d, qd);
    be_.matmul(o.reshape({n, qd}), false, wo, true, x_mid, 1.0, g == 0 ? 0.0 : 1.0);
    if (!t_o.empty()) be_.matmul(o.reshape({n, qd}), false, lora_o_columns(p, ws, g, G), true, t_o, 1.0, g ? 1.0 : 0.0);
  }
  if (!t_o.empty()) be_.matmul(t_o, false, p.b[kLoraO], true, x_mid, p.scale, 1.0);
}

// The backward of attention_forward_grouped, group by group: dx holds the gradient of x_mid;
// dh receives the gradient of the input norm's output (sum over groups of dq_g W_Q,g + dk_g
// W_K,g + dv_g W_V,g: the untiled path adds all of dq's contribution first, so on the CPU this
// sum is within rounding of it, not bit for bit); each weight gradient's slice is the untiled
// one's bit for bit (its own rows, or columns of W_O through ws.dwo). Each group's q, k, v are
// recomputed unless the layer kept every group's (checkpoint none); its o and LSE come from
// saved_o/saved_lse (attention_output), the kept activations (none), or a recomputed
// attention forward (layer: the price of never holding every head's o).
void LlamaModel::attention_backward_grouped(const LayerParams& p, const Batch& b, LayerActs& a, Workspace& ws,
                                            const Tensor& dx, const SavedAttention& saved) {
  const int64_t n = b.tokens_count(), d = cfg_.hidden_size, hd = cfg_.head_dim, G = opts_.head_groups;
  const int64_t hq = cfg_.num_heads / G, hkv = cfg_.num_kv_heads / G, qd = hq * hd, kvd = hkv * hd;
  const int64_t lse_n = b.batch * hq * b.seq;
  const double scale = attention_scale();
  const bool kept = a.q.numel() == G * n * qd;  // checkpoint none: every group's activations
  const Tensor &saved_o = saved.o, &saved_lse = saved.lse;
  const bool restored = !saved_o.empty(), streamed = restored && store_->streams_outputs();
  const Tensor wo = ws.wo.view({d, qd}), dwo = ws.dwo.view({d, qd}), Wo = p.w[kO].reshape({d * G * qd});
  const Tensor dWo = p.g[kO].empty() ? Tensor() : p.g[kO].reshape({d * G * qd});
  lora_grouped_begin(p, a, ws, dx);
  const Tensor dattn = ws.head_in.view({n, qd}), dq = ws.dq.view({n, qd}), dk = ws.dk.view({n, kvd});
  const Tensor dv = ws.dv.view({n, kvd}), dh = ws.dh.view({n, d}), h1 = a.h1.view({n, d});
  for (int64_t g = 0; g < G; ++g) {
    const QkvActs qa = qkv_acts(a, n, g, G);
    const Tensor &q = qa.q, &k = qa.k, &v = qa.v;
    Tensor o = restored ? group_part(saved_o, g, n * qd) : group_part(a.o, g, G, n * qd);
    Tensor lse = restored ? group_part(saved_lse, g, lse_n) : group_part(a.lse, g, G, lse_n);
    if (streamed) {
      const ActivationStore::GroupSlot f = store_->fetch_group(saved_o, saved_lse, g, G, true);
      o = f.o;
      lse = f.lse;
    }
    o = o.reshape({n, qd});
    const QkvWeights qw = qkv_weights(p, &a, n, g, G);
    const attention::AttentionTensors t{q.reshape({b.batch, b.seq, hq, hd}),
                                        k.reshape({b.batch, b.seq, hkv, hd}),
                                        v.reshape({b.batch, b.seq, hkv, hd}),
                                        o.reshape({b.batch, b.seq, hq, hd}),
                                        lse.reshape({b.batch, hq, b.seq}),
                                        scale,
                                        b.docs(),
                                        cfg_.window_of(p.layer)};
    if (!kept) {
      project_qkv(h1, qw, qa, ws.ones, b);
      if (!restored) group_attn_->forward(t);
    }
    be_.copy_2d(wo, qd, Wo.slice_flat(g * qd, {Wo.numel() - g * qd}), G * qd, d, qd);
    be_.matmul(dx, false, wo, false, dattn);
    if (!dWo.empty()) {
      const Tensor dwo_part = dWo.slice_flat(g * qd, {dWo.numel() - g * qd});
      be_.copy_2d(dwo, qd, dwo_part, G * qd, d, qd);
      be_.matmul(dx, true, o, false, dwo, 1.0, 1.0);
      be_.copy_2d(dwo_part, G * qd, dwo, qd, d, qd);
    }
    if (p.lora(kLoraO)) {  // dattn_g += u_o A_o,g; dA_o,g += u_o^T o_g
      const Tensor u_o = ws.lora_u[3].view({n, p.rank});
      be_.matmul(u_o, false, lora_o_columns(p, ws, g, G), false, dattn, 1.0, 1.0);
      lora_o_grad_columns(p, ws, g, G, u_o, o);
    }
    group_attn_->backward(t, {dattn.reshape({b.batch, b.seq, hq, hd}), dq.reshape({b.batch, b.seq, hq, hd}),
                              dk.reshape({b.batch, b.seq, hkv, hd}), dv.reshape({b.batch, b.seq, hkv, hd})});
    const QkvWeights gw = qkv_weights(p, &a, n, g, G, true);
    qkv_backward(qw, gw, qa, dq, dk, dv, ws.head_in.flat(), ws.ones, b);
    be_.matmul(dq, false, qw.wq, false, dh, 1.0, g == 0 ? 0.0 : 1.0);
    be_.matmul(dk, false, qw.wk, false, dh, 1.0, 1.0);
    be_.matmul(dv, false, qw.wv, false, dh, 1.0, 1.0);
    lora_grouped_qkv(p, qw, gw, g, dq, dk, dv, ws);
    if (!gw.wq.empty()) be_.matmul(dq, true, h1, false, gw.wq, 1.0, 1.0);
    if (!gw.wk.empty()) be_.matmul(dk, true, h1, false, gw.wk, 1.0, 1.0);
    if (!gw.wv.empty()) be_.matmul(dv, true, h1, false, gw.wv, 1.0, 1.0);
  }
  lora_grouped_end(p, a, ws, n);
}

// The tiled block's LoRA backward, before the groups: u_o = scale dx B_o, dB_o += scale dx^T t_o.
void LlamaModel::lora_grouped_begin(const LayerParams& p, LayerActs& a, Workspace& ws, const Tensor& dx) {
  if (!p.lora(kLoraO)) return;
  const int64_t n = dx.dim(0);
  be_.matmul(dx, true, a.lora_t[kLoraO].view({n, p.rank}), false, p.gb[kLoraO], p.scale, 1.0);
  be_.matmul(dx, false, p.b[kLoraO], false, ws.lora_u[3].view({n, p.rank}), p.scale, 0.0);
}

// Group g's part of q, k and v's adapters: u += scale dy_g B_g (summed over the groups), dB_g
// (the group's rows) += scale dy_g^T t.
void LlamaModel::lora_grouped_qkv(const LayerParams& p, const QkvWeights& w, const QkvWeights& gw, int64_t g,
                                  const Tensor& dq, const Tensor& dk, const Tensor& dv, Workspace& ws) {
  const Tensor* dys[3] = {&dq, &dk, &dv};
  const Tensor* b[3] = {&w.lbq, &w.lbk, &w.lbv};
  const Tensor* gb[3] = {&gw.lbq, &gw.lbk, &gw.lbv};
  const Tensor* t[3] = {&w.ltq, &w.ltk, &w.ltv};
  for (int k = kLoraQ; k <= kLoraV; ++k) {
    if (!p.lora(k)) continue;
    const Tensor u = ws.lora_u[static_cast<size_t>(k)].view({dys[k]->dim(0), p.rank});
    be_.matmul(*dys[k], true, *t[k], false, *gb[k], p.scale, 1.0);
    be_.matmul(*dys[k], false, *b[k], false, u, p.scale, g == 0 ? 0.0 : 1.0);
  }
}

// After the groups: dh += u A, dA += u^T h1 for q, k and v.
void LlamaModel::lora_grouped_end(const LayerParams& p, LayerActs& a, Workspace& ws, int64_t n) {
  const int64_t d = cfg_.hidden_size;
  const Tensor h1 = a.h1.view({n, d}), dh = ws.dh.view({n, d});
  for (int k = kLoraQ; k <= kLoraV; ++k) {
    if (!p.lora(k)) continue;
    const Tensor u = ws.lora_u[static_cast<size_t>(k)].view({n, p.rank});
    be_.matmul(u, true, h1, false, p.ga[static_cast<size_t>(k)], 1.0, 1.0);
    be_.matmul(u, false, p.a[static_cast<size_t>(k)], false, dh, 1.0, 1.0);
  }
}

}  // namespace easyctx::model
