#include "attention/dist_flash.h"

#include "attention/blocks.h"
#include "attention/documents.h"
#include "core/error.h"

namespace easyctx::attention {
using detail::acc_type;
using detail::check_sizes;
using detail::seq;
using ops::Buffer;
using ops::DType;
using ops::Tensor;

void DistFlashAttention::exchange(const Tensor& send, int dst, const Tensor& recv, int src) {
  if (dst == dist::kNoPeer && src == dist::kNoPeer) return;
  comm_.wait(be_.record());  // after the compute that wrote `send` and last read `recv`
  comm_.send_recv(send.data, static_cast<size_t>(send.numel()), dst, recv.data, static_cast<size_t>(recv.numel()), src,
                  send.dtype);
  be_.wait(comm_.record());  // compute that reads `recv` or rewrites `send` comes after it
}

namespace {
// Buffer labels (Backend::alloc's `what`, the memory plan's item names) are string literals,
// so a recorder may keep the pointers.
constexpr const char* kReceivedKV = "dist_flash received K, V";

// Peer at offset t along the chain 0..W-1, or kNoPeer past either end.
int peer(int r, int t, int W) { return (r + t >= 0 && r + t < W) ? r + t : dist::kNoPeer; }

// Whether query chunk a and key chunk a - t (chunks of c tokens) share a visible pair under
// the sliding window (0: none): the chunk's last key after its first query's position - window.
// The same on every rank, so a step every rank would skip is not exchanged at all.
bool in_window(int t, int64_t c, int64_t window) { return window <= 0 || (t - 1) * c + 1 < window; }
}  // namespace

// (`t` is the peer offset below: the call's tensors are `all`, one sequence's `one`.)
void DistFlashAttention::forward(const AttentionTensors& all) {
  check_sizes(all);
  const int W = comm_.size(), r = comm_.rank(), half = W / 2;
  const int64_t c = all.q.dim(1), Hq = all.q.dim(2), Hkv = all.k.dim(2), hd = all.q.dim(3);
  for (int64_t b = 0; b < all.q.dim(0); ++b) {
    const AttentionTensors one = seq(all, b);
    const Tensor &q = one.q, &k = one.k, &v = one.v, &o = one.o, &lse = one.lse;
    Buffer acc_o = be_.alloc(acc_type(lse), c * Hq * hd, "dist_flash output accumulator (f32)");
    Tensor ao = acc_o.view({1, c, Hq, hd});
    Buffer o_blk = be_.alloc(q.dtype, c * Hq * hd, "dist_flash block output");
    Buffer l_blk = be_.alloc(lse.dtype, Hq * c, "dist_flash block LSE");
    Tensor ob = o_blk.view({1, c, Hq, hd}), lb = l_blk.view({1, Hq, c});
    Buffer kr = be_.alloc(k.dtype, k.numel(), kReceivedKV), vr = be_.alloc(v.dtype, v.numel(), kReceivedKV);
    Tensor kt = kr.view({1, c, Hkv, hd}), vt = vr.view({1, c, Hkv, hd});
    ops::AttentionBlock blk;
    blk.scale = all.scale;
    blk.window = all.window;
    // Own query against key chunks r, r-1, ..., r-half.
    blk.causal = true;
    blk.q_offset = blk.k_offset = r * c;
    masked_attention_fwd(be_, one.docs, q, k, v, blk, ob, lse);
    be_.copy(ao, ob);
    for (int t = 1; t <= half && in_window(t, c, all.window); ++t) {
      exchange(k, peer(r, t, W), kt, peer(r, -t, W));
      exchange(v, peer(r, t, W), vt, peer(r, -t, W));
      if (peer(r, -t, W) == dist::kNoPeer) continue;
      blk.causal = false;
      blk.k_offset = (r - t) * c;
      if (masked_attention_fwd(be_, one.docs, q, kt, vt, blk, ob, lb)) be_.attention_merge(ao, lse, ob, lb);
    }
    // Helper part: query chunk r+t (t > half) against our own keys, result sent back.
    Buffer qr = be_.alloc(q.dtype, q.numel(), "dist_flash received query");
    Tensor qt = qr.view({1, c, Hq, hd});
    for (int t = half + 1; t < W && in_window(t, c, all.window); ++t) {
      exchange(q, peer(r, -t, W), qt, peer(r, t, W));
      if (peer(r, t, W) != dist::kNoPeer) {
        blk.causal = false;
        blk.q_offset = (r + t) * c;
        blk.k_offset = r * c;
        masked_attention_fwd(be_, one.docs, qt, k, v, blk, ob, lb);
      }
      // Partial (o, lse) goes back to the query's rank; ours comes from rank r-t.
      Buffer o_in = be_.alloc(q.dtype, c * Hq * hd, "dist_flash returned output");
      Buffer l_in = be_.alloc(lse.dtype, Hq * c, "dist_flash returned LSE");
      exchange(ob, peer(r, t, W), o_in.view({1, c, Hq, hd}), peer(r, -t, W));
      exchange(lb, peer(r, t, W), l_in.view({1, Hq, c}), peer(r, -t, W));
      if (peer(r, -t, W) != dist::kNoPeer)
        be_.attention_merge(ao, lse, o_in.view({1, c, Hq, hd}), l_in.view({1, Hq, c}));
    }
    be_.copy(o, ao);
  }
}

void DistFlashAttention::backward(const AttentionTensors& all, const AttentionGrads& gall) {
  check_sizes(all);
  const int W = comm_.size(), r = comm_.rank(), half = W / 2;
  const int64_t c = all.q.dim(1), Hq = all.q.dim(2), Hkv = all.k.dim(2), hd = all.q.dim(3);
  for (int64_t b = 0; b < all.q.dim(0); ++b) {
    const AttentionTensors one = seq(all, b);
    const AttentionGrads g = seq(gall, b);
    const Tensor &q = one.q, &k = one.k, &v = one.v, &o = one.o, &lse = one.lse, &dout = g.dout, &dq = g.dq, &dk = g.dk,
                 &dv = g.dv;
    // Gradients accumulate in fp32 (for fp32 and bf16 data); partials travel in fp32 too.
    const DType acc = acc_type(lse);
    const char* accs = "dist_flash dQ/dK/dV accumulators (f32)";
    Buffer dq_acc = be_.alloc(acc, q.numel(), accs), dk_acc = be_.alloc(acc, k.numel(), accs),
           dv_acc = be_.alloc(acc, v.numel(), accs);
    const Tensor dqa = dq_acc.view({1, c, Hq, hd}), dka = dk_acc.view({1, c, Hkv, hd}),
                 dva = dv_acc.view({1, c, Hkv, hd});
    ops::AttentionBlock blk;
    blk.scale = all.scale;
    blk.window = all.window;
    blk.causal = true;
    blk.q_offset = blk.k_offset = r * c;
    masked_attention_bwd(be_, one.docs, q, k, v, o, lse, dout, blk, dqa, dka, dva);
    // Own query against earlier key chunks: dK/dV partials go back to the key's rank.
    Buffer kr = be_.alloc(k.dtype, k.numel(), kReceivedKV), vr = be_.alloc(v.dtype, v.numel(), kReceivedKV);
    const char* dkv = "dist_flash dK/dV partials and received (f32)";
    Buffer dkp = be_.alloc(acc, k.numel(), dkv), dvp = be_.alloc(acc, v.numel(), dkv);
    Buffer dk_in = be_.alloc(acc, k.numel(), dkv), dv_in = be_.alloc(acc, v.numel(), dkv);
    Tensor kt = kr.view({1, c, Hkv, hd}), vt = vr.view({1, c, Hkv, hd});
    for (int t = 1; t <= half && in_window(t, c, all.window); ++t) {
      exchange(k, peer(r, t, W), kt, peer(r, -t, W));
      exchange(v, peer(r, t, W), vt, peer(r, -t, W));
      be_.fill(dkp.flat(), 0);
      be_.fill(dvp.flat(), 0);
      if (peer(r, -t, W) != dist::kNoPeer) {
        blk.causal = false;
        blk.k_offset = (r - t) * c;
        masked_attention_bwd(be_, one.docs, q, kt, vt, o, lse, dout, blk, dqa, dkp.view({1, c, Hkv, hd}),
                             dvp.view({1, c, Hkv, hd}));
      }
      exchange(dkp.view({1, c, Hkv, hd}), peer(r, -t, W), dk_in.view({1, c, Hkv, hd}), peer(r, t, W));
      exchange(dvp.view({1, c, Hkv, hd}), peer(r, -t, W), dv_in.view({1, c, Hkv, hd}), peer(r, t, W));
      if (peer(r, t, W) != dist::kNoPeer) {
        be_.axpy(dka, dk_in.view({1, c, Hkv, hd}), 1.0);
        be_.axpy(dva, dv_in.view({1, c, Hkv, hd}), 1.0);
      }
    }
    // Helper part: later queries against our keys; dQ partials go back, dK/dV stay here.
    const char* qod = "dist_flash received q, o, dout";
    Buffer qr = be_.alloc(q.dtype, q.numel(), qod), orr = be_.alloc(o.dtype, o.numel(), qod),
           dr = be_.alloc(dout.dtype, dout.numel(), qod);
    Buffer lr = be_.alloc(lse.dtype, lse.numel(), "dist_flash received LSE");
    const char* dqs = "dist_flash dQ partial and received (f32)";
    Buffer dqp = be_.alloc(acc, q.numel(), dqs), dq_in = be_.alloc(acc, q.numel(), dqs);
    Tensor qt = qr.view({1, c, Hq, hd}), ot = orr.view({1, c, Hq, hd}), dt = dr.view({1, c, Hq, hd}),
           lt = lr.view({1, Hq, c});
    for (int t = half + 1; t < W && in_window(t, c, all.window); ++t) {
      const int to = peer(r, -t, W), from = peer(r, t, W);
      exchange(q, to, qt, from);
      exchange(o, to, ot, from);
      exchange(lse, to, lt, from);
      exchange(dout, to, dt, from);
      be_.fill(dqp.flat(), 0);
      if (from != dist::kNoPeer) {
        blk.causal = false;
        blk.q_offset = (r + t) * c;
        blk.k_offset = r * c;
        masked_attention_bwd(be_, one.docs, qt, k, v, ot, lt, dt, blk, dqp.view({1, c, Hq, hd}), dka, dva);
      }
      exchange(dqp.view({1, c, Hq, hd}), from, dq_in.view({1, c, Hq, hd}), to);
      if (to != dist::kNoPeer) be_.axpy(dqa, dq_in.view({1, c, Hq, hd}), 1.0);
    }
    be_.copy(dq, dqa);
    be_.copy(dk, dka);
    be_.copy(dv, dva);
  }
}

}  // namespace easyctx::attention
