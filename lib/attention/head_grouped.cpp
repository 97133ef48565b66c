#include "attention/head_grouped.h"

#include "attention/blocks.h"
#include "core/error.h"

namespace easyctx::attention {
using detail::check_sizes;
using ops::Buffer;
using ops::Tensor;

HeadGroupedAttention::HeadGroupedAttention(ops::Backend& be, std::shared_ptr<SequenceAttention> inner, int64_t groups)
    : be_(be), inner_(std::move(inner)), groups_(groups) {
  EASYCTX_CHECK(inner_ != nullptr && groups_ >= 1,
                "HeadGroupedAttention: needs an inner strategy and groups >= 1, got ", groups_);
}

namespace {
// Heads [h0, h0 + packed heads) of x [B, S, H, hd] into packed [B, S, h, hd] (to_packed), or
// back.
void move_heads(ops::Backend& be, const Tensor& x, int64_t h0, const Tensor& packed, bool to_packed) {
  const int64_t H = x.dim(2), hd = x.dim(3), h = packed.dim(2), rows = x.dim(0) * x.dim(1);
  const Tensor part = x.slice_flat(h0 * hd, {x.numel() - h0 * hd});
  if (to_packed) be.copy_2d(packed, h * hd, part, H * hd, rows, h * hd);
  else be.copy_2d(part, H * hd, packed, h * hd, rows, h * hd);
}
// The same for lse [B, H, S] and packed [B, h, S].
void move_lse_heads(ops::Backend& be, const Tensor& lse, int64_t h0, const Tensor& packed, bool to_packed) {
  const int64_t H = lse.dim(1), S = lse.dim(2), h = packed.dim(1);
  const Tensor part = lse.slice_flat(h0 * S, {lse.numel() - h0 * S});
  if (to_packed) be.copy_2d(packed, h * S, part, H * S, lse.dim(0), h * S);
  else be.copy_2d(part, H * S, packed, h * S, lse.dim(0), h * S);
}

// Buffer labels (Backend::alloc's `what`, the memory plan's item names): string literals, so a
// recorder may keep the pointers.
constexpr const char* kPackQO = "head group packs: q, o";
constexpr const char* kPackQOD = "head group packs: q, o, dout";
constexpr const char* kPackKV = "head group packs: k, v";
constexpr const char* kPackLSE = "head group packs: LSE";
constexpr const char* kPackGrads = "head group packs: dq, dk, dv";

struct HeadSplit {
  int64_t B, S, hd, hq, hkv;  // hq, hkv: heads per group
};
HeadSplit head_split(const Tensor& q, const Tensor& k, int64_t groups) {
  EASYCTX_CHECK_INPUT(k.dim(2) % groups == 0, "activation.attention_head_groups: ", groups,
                      " does not divide the key/value heads (", k.dim(2), ")");
  return {q.dim(0), q.dim(1), q.dim(3), q.dim(2) / groups, k.dim(2) / groups};
}
}  // namespace

void HeadGroupedAttention::forward(const AttentionTensors& t) {
  check_sizes(t);
  if (groups_ == 1) return inner_->forward(t);
  const HeadSplit h = head_split(t.q, t.k, groups_);
  const int64_t qn = h.B * h.S * h.hq * h.hd, kn = h.B * h.S * h.hkv * h.hd;
  Buffer qg = be_.alloc(t.q.dtype, qn, kPackQO), kg = be_.alloc(t.k.dtype, kn, kPackKV);
  Buffer vg = be_.alloc(t.v.dtype, kn, kPackKV), og = be_.alloc(t.o.dtype, qn, kPackQO);
  Buffer lg = be_.alloc(t.lse.dtype, h.B * h.hq * h.S, kPackLSE);
  const AttentionTensors p{qg.view({h.B, h.S, h.hq, h.hd}),
                           kg.view({h.B, h.S, h.hkv, h.hd}),
                           vg.view({h.B, h.S, h.hkv, h.hd}),
                           og.view({h.B, h.S, h.hq, h.hd}),
                           lg.view({h.B, h.hq, h.S}),
                           t.scale,
                           t.docs,
                           t.window};
  for (int64_t g = 0; g < groups_; ++g) {
    move_heads(be_, t.q, g * h.hq, p.q, true);
    move_heads(be_, t.k, g * h.hkv, p.k, true);
    move_heads(be_, t.v, g * h.hkv, p.v, true);
    inner_->forward(p);
    move_heads(be_, t.o, g * h.hq, p.o, false);
    move_lse_heads(be_, t.lse, g * h.hq, p.lse, false);
  }
}

void HeadGroupedAttention::backward(const AttentionTensors& t, const AttentionGrads& gr) {
  check_sizes(t);
  if (groups_ == 1) return inner_->backward(t, gr);
  const HeadSplit h = head_split(t.q, t.k, groups_);
  const int64_t qn = h.B * h.S * h.hq * h.hd, kn = h.B * h.S * h.hkv * h.hd;
  Buffer qg = be_.alloc(t.q.dtype, qn, kPackQOD), kg = be_.alloc(t.k.dtype, kn, kPackKV);
  Buffer vg = be_.alloc(t.v.dtype, kn, kPackKV), og = be_.alloc(t.o.dtype, qn, kPackQOD);
  Buffer dog = be_.alloc(gr.dout.dtype, qn, kPackQOD), lg = be_.alloc(t.lse.dtype, h.B * h.hq * h.S, kPackLSE);
  Buffer dqg = be_.alloc(gr.dq.dtype, qn, kPackGrads), dkg = be_.alloc(gr.dk.dtype, kn, kPackGrads);
  Buffer dvg = be_.alloc(gr.dv.dtype, kn, kPackGrads);
  auto qs = [&](const Buffer& b) { return b.view({h.B, h.S, h.hq, h.hd}); };
  auto ks = [&](const Buffer& b) { return b.view({h.B, h.S, h.hkv, h.hd}); };
  // The packed copies of one head group.
  const AttentionTensors p{qs(qg), ks(kg), ks(vg), qs(og), lg.view({h.B, h.hq, h.S}), t.scale, t.docs, t.window};
  const AttentionGrads pg{qs(dog), qs(dqg), ks(dkg), ks(dvg)};
  for (int64_t g = 0; g < groups_; ++g) {
    const int64_t q0 = g * h.hq, k0 = g * h.hkv;
    move_heads(be_, t.q, q0, p.q, true);
    move_heads(be_, t.k, k0, p.k, true);
    move_heads(be_, t.v, k0, p.v, true);
    move_heads(be_, t.o, q0, p.o, true);
    move_heads(be_, gr.dout, q0, pg.dout, true);
    move_lse_heads(be_, t.lse, q0, p.lse, true);
    inner_->backward(p, pg);
    move_heads(be_, gr.dq, q0, pg.dq, false);
    move_heads(be_, gr.dk, k0, pg.dk, false);
    move_heads(be_, gr.dv, k0, pg.dv, false);
  }
}

}  // namespace easyctx::attention
