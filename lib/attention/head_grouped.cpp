#include "attention/head_grouped.h"

#include "attention/blocks.h"
#include "core/error.h"

namespace easyctx::attention {
using detail::acc_type;
using detail::check_sizes;
using detail::copy_lse_cols;
using detail::seq;
using detail::seq_rows;
using ops::Buffer;
using ops::DType;
using ops::Tensor;

HeadGroupedAttention::HeadGroupedAttention(ops::Backend& be, std::shared_ptr<SequenceAttention> inner, int64_t groups)
    : be_(be), inner_(std::move(inner)), groups_(groups) {
  EASYCTX_CHECK(inner_ != nullptr && groups_ >= 1, "HeadGroupedAttention: needs an inner strategy and groups >= 1, got ",
                groups_);
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

struct HeadSplit {
  int64_t B, S, hd, hq, hkv;  // hq, hkv: heads per group
};
HeadSplit head_split(const Tensor& q, const Tensor& k, int64_t groups) {
  EASYCTX_CHECK_INPUT(k.dim(2) % groups == 0, "activation.attention_head_groups: ", groups,
                      " does not divide the key/value heads (", k.dim(2), ")");
  return {q.dim(0), q.dim(1), q.dim(3), q.dim(2) / groups, k.dim(2) / groups};
}
}  // namespace

void HeadGroupedAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& o,
                                   const Tensor& lse) {
  check_sizes(q, k, v, o, lse);
  if (groups_ == 1) return inner_->forward(q, k, v, scale, o, lse);
  const HeadSplit h = head_split(q, k, groups_);
  const int64_t qn = h.B * h.S * h.hq * h.hd, kn = h.B * h.S * h.hkv * h.hd;
  Buffer qg = be_.alloc(q.dtype, qn), kg = be_.alloc(k.dtype, kn), vg = be_.alloc(v.dtype, kn);
  Buffer og = be_.alloc(o.dtype, qn), lg = be_.alloc(lse.dtype, h.B * h.hq * h.S);
  const Tensor qv = qg.view({h.B, h.S, h.hq, h.hd}), kv = kg.view({h.B, h.S, h.hkv, h.hd});
  const Tensor vv = vg.view({h.B, h.S, h.hkv, h.hd}), ov = og.view({h.B, h.S, h.hq, h.hd});
  const Tensor lv = lg.view({h.B, h.hq, h.S});
  for (int64_t g = 0; g < groups_; ++g) {
    move_heads(be_, q, g * h.hq, qv, true);
    move_heads(be_, k, g * h.hkv, kv, true);
    move_heads(be_, v, g * h.hkv, vv, true);
    inner_->forward(qv, kv, vv, scale, ov, lv);
    move_heads(be_, o, g * h.hq, ov, false);
    move_lse_heads(be_, lse, g * h.hq, lv, false);
  }
}

void HeadGroupedAttention::backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                    const Tensor& lse, const Tensor& dout, double scale, const Tensor& dq,
                                    const Tensor& dk, const Tensor& dv) {
  check_sizes(q, k, v, o, lse);
  if (groups_ == 1) return inner_->backward(q, k, v, o, lse, dout, scale, dq, dk, dv);
  const HeadSplit h = head_split(q, k, groups_);
  const int64_t qn = h.B * h.S * h.hq * h.hd, kn = h.B * h.S * h.hkv * h.hd;
  Buffer qg = be_.alloc(q.dtype, qn), kg = be_.alloc(k.dtype, kn), vg = be_.alloc(v.dtype, kn);
  Buffer og = be_.alloc(o.dtype, qn), dog = be_.alloc(dout.dtype, qn), lg = be_.alloc(lse.dtype, h.B * h.hq * h.S);
  Buffer dqg = be_.alloc(dq.dtype, qn), dkg = be_.alloc(dk.dtype, kn), dvg = be_.alloc(dv.dtype, kn);
  auto qs = [&](const Buffer& b) { return b.view({h.B, h.S, h.hq, h.hd}); };
  auto ks = [&](const Buffer& b) { return b.view({h.B, h.S, h.hkv, h.hd}); };
  const Tensor lv = lg.view({h.B, h.hq, h.S});
  for (int64_t g = 0; g < groups_; ++g) {
    const int64_t q0 = g * h.hq, k0 = g * h.hkv;
    move_heads(be_, q, q0, qs(qg), true);
    move_heads(be_, k, k0, ks(kg), true);
    move_heads(be_, v, k0, ks(vg), true);
    move_heads(be_, o, q0, qs(og), true);
    move_heads(be_, dout, q0, qs(dog), true);
    move_lse_heads(be_, lse, q0, lv, true);
    inner_->backward(qs(qg), ks(kg), ks(vg), qs(og), lv, qs(dog), scale, qs(dqg), ks(dkg), ks(dvg));
    move_heads(be_, dq, q0, qs(dqg), false);
    move_heads(be_, dk, k0, ks(dkg), false);
    move_heads(be_, dv, k0, ks(dvg), false);
  }
}

}  // namespace easyctx::attention
