#include "attention/sequence_parallel.h"

#include <chrono>
#include <string>

#include "core/error.h"

namespace easyctx::attention {
namespace {

using ops::Buffer;
using ops::DType;
using ops::Tensor;

// Sequence b of a [B, S, ...] tensor as a [1, S, ...] view.
Tensor seq(const Tensor& t, int64_t b) { return t.rows(b, 1); }

// Rows [row, row+len) of a [1, S, H, hd] view, as [1, len, H, hd].
Tensor seq_rows(const Tensor& t, int64_t row, int64_t len) {
  const int64_t H = t.dim(2), hd = t.dim(3);
  return t.slice_flat(row * H * hd, {1, len, H, hd});
}

// The fp32 (fp64 for fp64 data) type that partial outputs are merged in.
DType acc_type(const Tensor& lse) { return lse.dtype; }

// Copies lse[1, H, S] columns [col, col+len) into dst [1, H, len] (to_block) or back.
void copy_lse_cols(ops::Backend& be, const Tensor& lse, int64_t col, const Tensor& block, bool to_block) {
  const int64_t H = lse.dim(1), S = lse.dim(2), len = block.dim(2);
  for (int64_t h = 0; h < H; ++h) {
    Tensor full = lse.slice_flat(h * S + col, {len});
    Tensor part = block.slice_flat(h * len, {len});
    if (to_block) be.copy(part, full);
    else be.copy(full, part);
  }
}

void check_sizes(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse) {
  EASYCTX_CHECK(q.ndim == 4 && k.ndim == 4 && v.ndim == 4, "sequence-parallel attention: q/k/v must be [B, S, H, hd]");
  EASYCTX_CHECK(k.dim(0) == q.dim(0) && k.dim(1) == q.dim(1) && v.numel() == k.numel(),
                "sequence-parallel attention: q ", q.describe(), " and k ", k.describe(), " disagree");
  EASYCTX_CHECK(o.numel() == q.numel() && lse.numel() == q.dim(0) * q.dim(1) * q.dim(2),
                "sequence-parallel attention: o ", o.describe(), " or lse ", lse.describe(), " has the wrong size");
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Zigzag ring
// ---------------------------------------------------------------------------------------

void ZigzagRingAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& o,
                                  const Tensor& lse) {
  check_sizes(q, k, v, o, lse);
  for (int64_t b = 0; b < q.dim(0); ++b) forward_one(seq(q, b), seq(k, b), seq(v, b), scale, seq(o, b), seq(lse, b));
}

void ZigzagRingAttention::backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                   const Tensor& lse, const Tensor& dout, double scale, const Tensor& dq,
                                   const Tensor& dk, const Tensor& dv) {
  check_sizes(q, k, v, o, lse);
  for (int64_t b = 0; b < q.dim(0); ++b)
    backward_one(seq(q, b), seq(k, b), seq(v, b), seq(o, b), seq(lse, b), seq(dout, b), scale, seq(dq, b), seq(dk, b),
                 seq(dv, b));
}

namespace {
struct Zigzag {
  int W, r;
  int64_t c;  // tokens per chunk
  int64_t chunk(int rank, int i) const { return i == 0 ? rank : 2 * W - 1 - rank; }
};
Zigzag zigzag_of(const dist::Comm& ring, const Tensor& q) {
  Zigzag z{ring.size(), ring.rank(), q.dim(1) / 2};
  EASYCTX_CHECK(q.dim(1) % 2 == 0, "zigzag_ring: the local sequence (", q.dim(1),
                " tokens) must hold two equal chunks; the loader pads the sequence to a multiple of 2W");
  return z;
}
}  // namespace

void ZigzagRingAttention::exchange_begin(const Buffer* send, Buffer* recv, int first, int last) {
  const int W = ring_.size(), dst = (ring_.rank() + 1) % W, from = (ring_.rank() - 1 + W) % W;
  be_.synchronize();  // the sent buffers are written and the received-into ones no longer read
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = first; i <= last; ++i)
    ring_.send_recv(send[i].data(), static_cast<size_t>(send[i].numel()), dst, recv[i].data(),
                    static_cast<size_t>(recv[i].numel()), from, send[i].dtype());
  comm_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ZigzagRingAttention::exchange_end() {
  const auto t0 = std::chrono::steady_clock::now();
  ring_.synchronize();
  comm_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ZigzagRingAttention::forward_one(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                      const Tensor& o, const Tensor& lse) {
  const Zigzag z = zigzag_of(ring_, q);
  const int64_t Hq = q.dim(2), Hkv = k.dim(2), hd = q.dim(3), S = q.dim(1), c = z.c;
  const DType acc = acc_type(lse);
  // Per local query chunk: running output and LSE, merged in fp32.
  Buffer acc_o[2] = {be_.alloc(acc, c * Hq * hd), be_.alloc(acc, c * Hq * hd)};
  Buffer acc_lse[2] = {be_.alloc(lse.dtype, Hq * c), be_.alloc(lse.dtype, Hq * c)};
  bool started[2] = {false, false};
  Buffer o_blk = be_.alloc(q.dtype, c * Hq * hd), lse_blk = be_.alloc(lse.dtype, Hq * c);
  // K/V of the visiting rank, double-buffered: [1, S, Hkv, hd] each.
  Buffer kv[2][2] = {{be_.alloc(k.dtype, k.numel()), be_.alloc(v.dtype, v.numel())},
                     {be_.alloc(k.dtype, k.numel()), be_.alloc(v.dtype, v.numel())}};
  be_.copy(kv[0][0].view({1, S, Hkv, hd}), k);
  be_.copy(kv[0][1].view({1, S, Hkv, hd}), v);

  for (int s = 0; s < z.W; ++s) {
    const int src = (z.r - s + z.W) % z.W;
    Buffer* cur = kv[s % 2];
    Tensor kc = cur[0].view({1, S, Hkv, hd}), vc = cur[1].view({1, S, Hkv, hd});
    if (s + 1 < z.W) exchange_begin(cur, kv[(s + 1) % 2], 0, 1);  // the next step's K/V travel meanwhile
    for (int qa = 0; qa < 2; ++qa)
      for (int kb = 0; kb < 2; ++kb) {
        const int64_t a = z.chunk(z.r, qa), bch = z.chunk(src, kb);
        if (bch > a) continue;  // entirely in the future of this query chunk
        ops::AttentionBlock blk;
        blk.scale = scale;
        blk.causal = (a == bch);
        blk.q_offset = a * c;
        blk.k_offset = bch * c;
        Tensor ob = o_blk.view({1, c, Hq, hd}), lb = lse_blk.view({1, Hq, c});
        be_.attention_fwd(seq_rows(q, qa * c, c), seq_rows(kc, kb * c, c), seq_rows(vc, kb * c, c), blk, ob, lb);
        Tensor ao = acc_o[qa].view({1, c, Hq, hd}), al = acc_lse[qa].view({1, Hq, c});
        if (!started[qa]) {
          be_.copy(ao, ob);
          be_.copy(al, lb);
          started[qa] = true;
        } else {
          be_.attention_merge(ao, al, ob, lb);
        }
      }
    if (s + 1 < z.W) exchange_end();
  }
  for (int qa = 0; qa < 2; ++qa) {
    be_.copy(seq_rows(o, qa * c, c), acc_o[qa].view({1, c, Hq, hd}));
    copy_lse_cols(be_, lse, qa * c, acc_lse[qa].view({1, Hq, c}), false);
  }
}

void ZigzagRingAttention::backward_one(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                       const Tensor& lse, const Tensor& dout, double scale, const Tensor& dq,
                                       const Tensor& dk, const Tensor& dv) {
  const Zigzag z = zigzag_of(ring_, q);
  const int64_t Hq = q.dim(2), Hkv = k.dim(2), hd = q.dim(3), S = q.dim(1), c = z.c;
  const DType acc = acc_type(lse);
  Buffer lse_ch[2] = {be_.alloc(lse.dtype, Hq * c), be_.alloc(lse.dtype, Hq * c)};
  for (int qa = 0; qa < 2; ++qa) copy_lse_cols(be_, lse, qa * c, lse_ch[qa].view({1, Hq, c}), true);
  // dQ and the dK/dV accumulators that travel with the visiting K/V are fp32 (for fp32 and
  // bf16 data), so rounding does not compound over the ring steps.
  Buffer dq_acc = be_.alloc(acc, q.numel());
  const Tensor dqa = dq_acc.view({1, S, Hq, hd});
  Buffer kv[2][4];
  for (auto& set : kv) {
    set[0] = be_.alloc(k.dtype, k.numel());
    set[1] = be_.alloc(v.dtype, v.numel());
    set[2] = be_.alloc(acc, k.numel());
    set[3] = be_.alloc(acc, v.numel());
  }
  be_.copy(kv[0][0].view({1, S, Hkv, hd}), k);
  be_.copy(kv[0][1].view({1, S, Hkv, hd}), v);

  for (int s = 0; s < z.W; ++s) {
    const int src = (z.r - s + z.W) % z.W;
    Buffer* cur = kv[s % 2];
    Tensor kc = cur[0].view({1, S, Hkv, hd}), vc = cur[1].view({1, S, Hkv, hd});
    Tensor dkc = cur[2].view({1, S, Hkv, hd}), dvc = cur[3].view({1, S, Hkv, hd});
    if (s + 1 < z.W) exchange_begin(cur, kv[(s + 1) % 2], 0, 1);  // the next step's K/V travel meanwhile
    for (int qa = 0; qa < 2; ++qa)
      for (int kb = 0; kb < 2; ++kb) {
        const int64_t a = z.chunk(z.r, qa), bch = z.chunk(src, kb);
        if (bch > a) continue;
        ops::AttentionBlock blk;
        blk.scale = scale;
        blk.causal = (a == bch);
        blk.q_offset = a * c;
        blk.k_offset = bch * c;
        be_.attention_bwd(seq_rows(q, qa * c, c), seq_rows(kc, kb * c, c), seq_rows(vc, kb * c, c),
                          seq_rows(o, qa * c, c), lse_ch[qa].view({1, Hq, c}), seq_rows(dout, qa * c, c), blk,
                          seq_rows(dqa, qa * c, c), seq_rows(dkc, kb * c, c), seq_rows(dvc, kb * c, c));
      }
    if (s + 1 < z.W) {
      exchange_end();
      exchange(cur, kv[(s + 1) % 2], 2, 3);  // this step's dK/dV accumulators follow their K/V
    } else if (z.W > 1) {
      // The accumulators we hold belong to rank r+1: one more hop brings ours home.
      Buffer* nxt = kv[(s + 1) % 2];
      exchange(cur, nxt, 2, 3);
      be_.copy(dk, nxt[2].view({1, S, Hkv, hd}));
      be_.copy(dv, nxt[3].view({1, S, Hkv, hd}));
    } else {
      be_.copy(dk, dkc);
      be_.copy(dv, dvc);
    }
  }
  be_.copy(dq, dqa);
}

// ---------------------------------------------------------------------------------------
// LightSeq-style distributed attention
// ---------------------------------------------------------------------------------------

void DistFlashAttention::exchange(const Tensor& send, int dst, const Tensor& recv, int src) {
  if (dst == dist::kNoPeer && src == dist::kNoPeer) return;
  be_.synchronize();
  comm_.send_recv(send.data, static_cast<size_t>(send.numel()), dst, recv.data, static_cast<size_t>(recv.numel()), src,
                  send.dtype);
  comm_.synchronize();
}

namespace {
// Peer at offset t along the chain 0..W-1, or kNoPeer past either end.
int peer(int r, int t, int W) { return (r + t >= 0 && r + t < W) ? r + t : dist::kNoPeer; }
}  // namespace

void DistFlashAttention::forward(const Tensor& qall, const Tensor& kall, const Tensor& vall, double scale,
                                 const Tensor& oall, const Tensor& lseall) {
  check_sizes(qall, kall, vall, oall, lseall);
  const int W = comm_.size(), r = comm_.rank(), half = W / 2;
  const int64_t c = qall.dim(1), Hq = qall.dim(2), Hkv = kall.dim(2), hd = qall.dim(3);
  for (int64_t b = 0; b < qall.dim(0); ++b) {
    Tensor q = seq(qall, b), k = seq(kall, b), v = seq(vall, b), o = seq(oall, b), lse = seq(lseall, b);
    Buffer acc_o = be_.alloc(acc_type(lse), c * Hq * hd);
    Tensor ao = acc_o.view({1, c, Hq, hd});
    Buffer o_blk = be_.alloc(q.dtype, c * Hq * hd), l_blk = be_.alloc(lse.dtype, Hq * c);
    Tensor ob = o_blk.view({1, c, Hq, hd}), lb = l_blk.view({1, Hq, c});
    Buffer kr = be_.alloc(k.dtype, k.numel()), vr = be_.alloc(v.dtype, v.numel());
    Tensor kt = kr.view({1, c, Hkv, hd}), vt = vr.view({1, c, Hkv, hd});
    ops::AttentionBlock blk;
    blk.scale = scale;
    // Own query against key chunks r, r-1, ..., r-half.
    blk.causal = true;
    blk.q_offset = blk.k_offset = r * c;
    be_.attention_fwd(q, k, v, blk, ob, lse);
    be_.copy(ao, ob);
    for (int t = 1; t <= half; ++t) {
      exchange(k, peer(r, t, W), kt, peer(r, -t, W));
      exchange(v, peer(r, t, W), vt, peer(r, -t, W));
      if (peer(r, -t, W) == dist::kNoPeer) continue;
      blk.causal = false;
      blk.k_offset = (r - t) * c;
      be_.attention_fwd(q, kt, vt, blk, ob, lb);
      be_.attention_merge(ao, lse, ob, lb);
    }
    // Helper part: query chunk r+t (t > half) against our own keys, result sent back.
    Buffer qr = be_.alloc(q.dtype, q.numel());
    Tensor qt = qr.view({1, c, Hq, hd});
    for (int t = half + 1; t < W; ++t) {
      exchange(q, peer(r, -t, W), qt, peer(r, t, W));
      if (peer(r, t, W) != dist::kNoPeer) {
        blk.causal = false;
        blk.q_offset = (r + t) * c;
        blk.k_offset = r * c;
        be_.attention_fwd(qt, k, v, blk, ob, lb);
      }
      // Partial (o, lse) goes back to the query's rank; ours comes from rank r-t.
      Buffer o_in = be_.alloc(q.dtype, c * Hq * hd), l_in = be_.alloc(lse.dtype, Hq * c);
      exchange(ob, peer(r, t, W), o_in.view({1, c, Hq, hd}), peer(r, -t, W));
      exchange(lb, peer(r, t, W), l_in.view({1, Hq, c}), peer(r, -t, W));
      if (peer(r, -t, W) != dist::kNoPeer) be_.attention_merge(ao, lse, o_in.view({1, c, Hq, hd}), l_in.view({1, Hq, c}));
    }
    be_.copy(o, ao);
  }
}

void DistFlashAttention::backward(const Tensor& qall, const Tensor& kall, const Tensor& vall, const Tensor& oall,
                                  const Tensor& lseall, const Tensor& doall, double scale, const Tensor& dqall,
                                  const Tensor& dkall, const Tensor& dvall) {
  check_sizes(qall, kall, vall, oall, lseall);
  const int W = comm_.size(), r = comm_.rank(), half = W / 2;
  const int64_t c = qall.dim(1), Hq = qall.dim(2), Hkv = kall.dim(2), hd = qall.dim(3);
  for (int64_t b = 0; b < qall.dim(0); ++b) {
    Tensor q = seq(qall, b), k = seq(kall, b), v = seq(vall, b), o = seq(oall, b), lse = seq(lseall, b),
           dout = seq(doall, b), dq = seq(dqall, b), dk = seq(dkall, b), dv = seq(dvall, b);
    // Gradients accumulate in fp32 (for fp32 and bf16 data); partials travel in fp32 too.
    const DType acc = acc_type(lse);
    Buffer dq_acc = be_.alloc(acc, q.numel()), dk_acc = be_.alloc(acc, k.numel()), dv_acc = be_.alloc(acc, v.numel());
    const Tensor dqa = dq_acc.view({1, c, Hq, hd}), dka = dk_acc.view({1, c, Hkv, hd}), dva = dv_acc.view({1, c, Hkv, hd});
    ops::AttentionBlock blk;
    blk.scale = scale;
    blk.causal = true;
    blk.q_offset = blk.k_offset = r * c;
    be_.attention_bwd(q, k, v, o, lse, dout, blk, dqa, dka, dva);
    // Own query against earlier key chunks: dK/dV partials go back to the key's rank.
    Buffer kr = be_.alloc(k.dtype, k.numel()), vr = be_.alloc(v.dtype, v.numel());
    Buffer dkp = be_.alloc(acc, k.numel()), dvp = be_.alloc(acc, v.numel());
    Buffer dk_in = be_.alloc(acc, k.numel()), dv_in = be_.alloc(acc, v.numel());
    Tensor kt = kr.view({1, c, Hkv, hd}), vt = vr.view({1, c, Hkv, hd});
    for (int t = 1; t <= half; ++t) {
      exchange(k, peer(r, t, W), kt, peer(r, -t, W));
      exchange(v, peer(r, t, W), vt, peer(r, -t, W));
      be_.fill(dkp.flat(), 0);
      be_.fill(dvp.flat(), 0);
      if (peer(r, -t, W) != dist::kNoPeer) {
        blk.causal = false;
        blk.k_offset = (r - t) * c;
        be_.attention_bwd(q, kt, vt, o, lse, dout, blk, dqa, dkp.view({1, c, Hkv, hd}), dvp.view({1, c, Hkv, hd}));
      }
      exchange(dkp.view({1, c, Hkv, hd}), peer(r, -t, W), dk_in.view({1, c, Hkv, hd}), peer(r, t, W));
      exchange(dvp.view({1, c, Hkv, hd}), peer(r, -t, W), dv_in.view({1, c, Hkv, hd}), peer(r, t, W));
      if (peer(r, t, W) != dist::kNoPeer) {
        be_.axpy(dka, dk_in.view({1, c, Hkv, hd}), 1.0);
        be_.axpy(dva, dv_in.view({1, c, Hkv, hd}), 1.0);
      }
    }
    // Helper part: later queries against our keys; dQ partials go back, dK/dV stay here.
    Buffer qr = be_.alloc(q.dtype, q.numel()), orr = be_.alloc(o.dtype, o.numel()), dr = be_.alloc(dout.dtype, dout.numel());
    Buffer lr = be_.alloc(lse.dtype, lse.numel()), dqp = be_.alloc(acc, q.numel()), dq_in = be_.alloc(acc, q.numel());
    Tensor qt = qr.view({1, c, Hq, hd}), ot = orr.view({1, c, Hq, hd}), dt = dr.view({1, c, Hq, hd}),
           lt = lr.view({1, Hq, c});
    for (int t = half + 1; t < W; ++t) {
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
        be_.attention_bwd(qt, k, v, ot, lt, dt, blk, dqp.view({1, c, Hq, hd}), dka, dva);
      }
      exchange(dqp.view({1, c, Hq, hd}), from, dq_in.view({1, c, Hq, hd}), to);
      if (to != dist::kNoPeer) be_.axpy(dqa, dq_in.view({1, c, Hq, hd}), 1.0);
    }
    be_.copy(dq, dqa);
    be_.copy(dk, dka);
    be_.copy(dv, dva);
  }
}

// ---------------------------------------------------------------------------------------
// Ulysses (and usp: Ulysses with a zigzag ring inside)
// ---------------------------------------------------------------------------------------

UlyssesAttention::UlyssesAttention(ops::Backend& be, dist::Comm& group, std::unique_ptr<SequenceAttention> inner)
    : be_(be), comm_(group), inner_(std::move(inner)) {
  inner_is_ring_ = inner_ != nullptr;
  if (!inner_) inner_ = std::make_unique<LocalAttention>(be_);
}

int64_t UlyssesAttention::Heads::kv_head_of(int rank) const {
  if (kv_per_rank * static_cast<int64_t>(hq / q_per_rank) == hkv) return rank * kv_per_rank;
  return (rank * q_per_rank) / (hq / hkv);
}

UlyssesAttention::Heads UlyssesAttention::heads(const Tensor& q, const Tensor& k) const {
  const int64_t U = comm_.size();
  Heads h{q.dim(2), k.dim(2), q.dim(3), 0, 0};
  EASYCTX_CHECK_INPUT(h.hq % U == 0, "ulysses: parallel.sequence.size (", U, ") must divide the attention heads (",
                      h.hq, ")");
  h.q_per_rank = h.hq / U;
  if (h.hkv % U == 0) {
    h.kv_per_rank = h.hkv / U;
  } else {
    EASYCTX_CHECK_INPUT(U % h.hkv == 0, "ulysses: parallel.sequence.size (", U, ") must divide the key/value heads (",
                        h.hkv, ") or be a multiple of them");
    h.kv_per_rank = 1;  // several ranks read the same kv head
  }
  return h;
}

Buffer UlyssesAttention::to_heads(const Tensor& x, int64_t h_total, int64_t h_per, bool kv, const Heads& hs) {
  const int U = comm_.size();
  const int64_t S = x.dim(1), hd = x.dim(3), blk = S * h_per * hd;
  Buffer send = be_.alloc(x.dtype, blk * U), recv = be_.alloc(x.dtype, blk * U);
  for (int j = 0; j < U; ++j) {  // rank j's heads of every token: one strided copy
    const int64_t h0 = kv ? hs.kv_head_of(j) : j * h_per;
    be_.copy_2d(send.flat().slice_flat(j * blk, {blk}), h_per * hd, x.slice_flat(h0 * hd, {x.numel() - h0 * hd}),
                h_total * hd, S, h_per * hd);
  }
  be_.synchronize();
  comm_.all_to_all(send.data(), recv.data(), static_cast<size_t>(blk), x.dtype);
  comm_.synchronize();
  return recv;  // [U * S, h_per, hd]: the gathered sequence in rank order
}

void UlyssesAttention::from_heads(const Tensor& xh, int64_t h_total, int64_t h_per, bool kv, const Heads& hs,
                                  const Tensor& x) {
  const int U = comm_.size();
  const int64_t S = x.dim(1), hd = x.dim(3), blk = S * h_per * hd;
  Buffer recv = be_.alloc(xh.dtype, blk * U);
  be_.synchronize();
  comm_.all_to_all(xh.data, recv.data(), static_cast<size_t>(blk), xh.dtype);
  comm_.synchronize();
  // Rank i's heads of every token back into x, one strided copy each; a kv head that several
  // ranks held (Hkv < U) gets the sum of their gradients, added in rank order.
  std::vector<char> written(static_cast<size_t>(h_total), 0);
  Buffer sum;
  for (int i = 0; i < U; ++i) {
    const int64_t h0 = kv ? hs.kv_head_of(i) : i * h_per;
    const Tensor part = x.slice_flat(h0 * hd, {x.numel() - h0 * hd}), mine = recv.flat().slice_flat(i * blk, {blk});
    if (!written[static_cast<size_t>(h0)]) {
      be_.copy_2d(part, h_total * hd, mine, h_per * hd, S, h_per * hd);
    } else {
      if (sum.numel() == 0) sum = be_.alloc(xh.dtype, blk);
      be_.copy_2d(sum.flat(), h_per * hd, part, h_total * hd, S, h_per * hd);
      be_.axpy(sum.flat(), mine, 1.0);
      be_.copy_2d(part, h_total * hd, sum.flat(), h_per * hd, S, h_per * hd);
    }
    for (int64_t h = h0; h < h0 + h_per; ++h) written[static_cast<size_t>(h)] = 1;
  }
}

Buffer UlyssesAttention::lse_to_heads(const Tensor& lse, int64_t h_per, int64_t s_local) {
  const int U = comm_.size();
  const int64_t blk = h_per * s_local;
  Buffer recv = be_.alloc(lse.dtype, blk * U), out = be_.alloc(lse.dtype, blk * U);
  // lse [1, Hq, S_l]: block j = heads of rank j, contiguous.
  be_.synchronize();
  comm_.all_to_all(lse.data, recv.data(), static_cast<size_t>(blk), lse.dtype);
  comm_.synchronize();
  // recv [U][h_per][S_l] -> out [h_per][U * S_l]
  for (int i = 0; i < U; ++i)
    for (int64_t h = 0; h < h_per; ++h)
      be_.copy(out.flat().slice_flat(h * U * s_local + i * s_local, {s_local}),
               recv.flat().slice_flat((i * h_per + h) * s_local, {s_local}));
  return out;
}

void UlyssesAttention::lse_to_seq(const Tensor& lse_h, int64_t h_per, int64_t s_local, const Tensor& lse) {
  const int U = comm_.size();
  const int64_t blk = h_per * s_local;
  Buffer send = be_.alloc(lse.dtype, blk * U);
  for (int j = 0; j < U; ++j)
    for (int64_t h = 0; h < h_per; ++h)
      be_.copy(send.flat().slice_flat((j * h_per + h) * s_local, {s_local}),
               lse_h.slice_flat(h * U * s_local + j * s_local, {s_local}));
  be_.synchronize();
  comm_.all_to_all(send.data(), lse.data, static_cast<size_t>(blk), lse.dtype);
  comm_.synchronize();
}

void UlyssesAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& o,
                               const Tensor& lse) {
  check_sizes(q, k, v, o, lse);
  const Heads hs = heads(q, k);
  const int64_t U = comm_.size(), hd = hs.hd;
  for (int64_t b = 0; b < q.dim(0); ++b) {
    const int64_t S = q.dim(1), Sg = S * U;
    Buffer qh = to_heads(seq(q, b), hs.hq, hs.q_per_rank, false, hs);
    Buffer kh = to_heads(seq(k, b), hs.hkv, hs.kv_per_rank, true, hs);
    Buffer vh = to_heads(seq(v, b), hs.hkv, hs.kv_per_rank, true, hs);
    Buffer oh = be_.alloc(o.dtype, Sg * hs.q_per_rank * hd), lh = be_.alloc(lse.dtype, hs.q_per_rank * Sg);
    inner_->forward(qh.view({1, Sg, hs.q_per_rank, hd}), kh.view({1, Sg, hs.kv_per_rank, hd}),
                    vh.view({1, Sg, hs.kv_per_rank, hd}), scale, oh.view({1, Sg, hs.q_per_rank, hd}),
                    lh.view({1, hs.q_per_rank, Sg}));
    from_heads(oh.view({1, Sg, hs.q_per_rank, hd}), hs.hq, hs.q_per_rank, false, hs, seq(o, b));
    lse_to_seq(lh.view({1, hs.q_per_rank, Sg}), hs.q_per_rank, S, seq(lse, b));
  }
}

void UlyssesAttention::backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                const Tensor& lse, const Tensor& dout, double scale, const Tensor& dq,
                                const Tensor& dk, const Tensor& dv) {
  check_sizes(q, k, v, o, lse);
  const Heads hs = heads(q, k);
  const int64_t U = comm_.size(), hd = hs.hd;
  for (int64_t b = 0; b < q.dim(0); ++b) {
    const int64_t S = q.dim(1), Sg = S * U;
    const int64_t nq = hs.q_per_rank, nkv = hs.kv_per_rank;
    Buffer qh = to_heads(seq(q, b), hs.hq, nq, false, hs);
    Buffer kh = to_heads(seq(k, b), hs.hkv, nkv, true, hs);
    Buffer vh = to_heads(seq(v, b), hs.hkv, nkv, true, hs);
    Buffer oh = to_heads(seq(o, b), hs.hq, nq, false, hs);
    Buffer dh = to_heads(seq(dout, b), hs.hq, nq, false, hs);
    Buffer lh = lse_to_heads(seq(lse, b), nq, S);
    Buffer dqh = be_.alloc(dq.dtype, Sg * nq * hd), dkh = be_.alloc(dk.dtype, Sg * nkv * hd),
           dvh = be_.alloc(dv.dtype, Sg * nkv * hd);
    inner_->backward(qh.view({1, Sg, nq, hd}), kh.view({1, Sg, nkv, hd}), vh.view({1, Sg, nkv, hd}),
                     oh.view({1, Sg, nq, hd}), lh.view({1, nq, Sg}), dh.view({1, Sg, nq, hd}), scale,
                     dqh.view({1, Sg, nq, hd}), dkh.view({1, Sg, nkv, hd}), dvh.view({1, Sg, nkv, hd}));
    from_heads(dqh.view({1, Sg, nq, hd}), hs.hq, nq, false, hs, seq(dq, b));
    from_heads(dkh.view({1, Sg, nkv, hd}), hs.hkv, nkv, true, hs, seq(dk, b));
    from_heads(dvh.view({1, Sg, nkv, hd}), hs.hkv, nkv, true, hs, seq(dv, b));
  }
}

// ---------------------------------------------------------------------------------------
// Head groups
// ---------------------------------------------------------------------------------------

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
