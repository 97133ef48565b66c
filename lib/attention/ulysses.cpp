#include "attention/ulysses.h"

#include <vector>

#include "attention/blocks.h"
#include "core/error.h"

namespace easyctx::attention {
using detail::check_sizes;
using detail::seq;
using ops::Buffer;
using ops::Tensor;

namespace {
// Buffer labels (Backend::alloc's `what`, the memory plan's item names): static strings, so a
// recorder may keep the pointers.
struct UlyssesLabels {
  const char *send, *q, *k, *v, *o, *dout, *lse, *grads, *recv, *kv_sum, *lse_send, *lse_recv;
};
constexpr UlyssesLabels kUlyssesLabels{
    "ulysses all-to-all send",    "ulysses q (head-sharded)",          "ulysses k (head-sharded)",
    "ulysses v (head-sharded)",   "ulysses o (head-sharded)",          "ulysses dout (head-sharded)",
    "ulysses LSE (head-sharded)", "ulysses dq, dk, dv (head-sharded)", "ulysses all-to-all receive",
    "ulysses shared kv head sum", "ulysses LSE all-to-all send",       "ulysses LSE all-to-all receive"};
constexpr UlyssesLabels kUspLabels{
    "usp all-to-all send",    "usp q (head-sharded)",    "usp k (head-sharded)",    "usp v (head-sharded)",
    "usp o (head-sharded)",   "usp dout (head-sharded)", "usp LSE (head-sharded)",  "usp dq, dk, dv (head-sharded)",
    "usp all-to-all receive", "usp shared kv head sum",  "usp LSE all-to-all send", "usp LSE all-to-all receive"};
const UlyssesLabels& labels(bool usp) { return usp ? kUspLabels : kUlyssesLabels; }
}  // namespace

UlyssesAttention::UlyssesAttention(ops::Backend& be, dist::Comm& group, std::unique_ptr<SequenceAttention> inner,
                                   std::string degree)
    : be_(be), comm_(group), inner_(std::move(inner)), degree_(std::move(degree)) {
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
  const std::string degree = degree_.empty() ? "parallel.sequence.size (" + std::to_string(U) + ")" : degree_;
  const char* fix = inner_is_ring_ ? "; set parallel.sequence.ulysses_size (or ring_degree) so that it does" : "";
  EASYCTX_CHECK_INPUT(h.hq % U == 0, name(), ": ", degree, " must divide the attention heads (", h.hq, ")", fix);
  h.q_per_rank = h.hq / U;
  if (h.hkv % U == 0) {
    h.kv_per_rank = h.hkv / U;
  } else {
    EASYCTX_CHECK_INPUT(U % h.hkv == 0, name(), ": ", degree, " must divide the key/value heads (", h.hkv,
                        ") or be a multiple of them", fix);
    h.kv_per_rank = 1;  // several ranks read the same kv head
  }
  return h;
}

void UlyssesAttention::all_to_all(const Tensor& send, const Tensor& recv, int64_t count) {
  comm_.wait(be_.record());  // after the compute that wrote `send` and last read `recv`
  comm_.all_to_all(send.data, recv.data, static_cast<size_t>(count), send.dtype);
  be_.wait(comm_.record());  // compute that reads `recv` or rewrites `send` comes after it
}

Buffer UlyssesAttention::to_heads(const Tensor& x, int64_t h_total, int64_t h_per, bool kv, const Heads& hs,
                                  const char* what) {
  const int U = comm_.size();
  const int64_t S = x.dim(1), hd = x.dim(3), blk = S * h_per * hd;
  Buffer send = be_.alloc(x.dtype, blk * U, labels(inner_is_ring_).send), recv = be_.alloc(x.dtype, blk * U, what);
  for (int j = 0; j < U; ++j) {  // rank j's heads of every token: one strided copy
    const int64_t h0 = kv ? hs.kv_head_of(j) : j * h_per;
    be_.copy_2d(send.flat().slice_flat(j * blk, {blk}), h_per * hd, x.slice_flat(h0 * hd, {x.numel() - h0 * hd}),
                h_total * hd, S, h_per * hd);
  }
  all_to_all(send.flat(), recv.flat(), blk);
  return recv;  // [U * S, h_per, hd]: the gathered sequence in rank order
}

void UlyssesAttention::from_heads(const Tensor& xh, int64_t h_total, int64_t h_per, bool kv, const Heads& hs,
                                  const Tensor& x) {
  const int U = comm_.size();
  const int64_t S = x.dim(1), hd = x.dim(3), blk = S * h_per * hd;
  Buffer recv = be_.alloc(xh.dtype, blk * U, labels(inner_is_ring_).recv);
  all_to_all(xh, recv.flat(), blk);
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
      if (sum.numel() == 0) sum = be_.alloc(xh.dtype, blk, labels(inner_is_ring_).kv_sum);
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
  const UlyssesLabels& L = labels(inner_is_ring_);
  Buffer recv = be_.alloc(lse.dtype, blk * U, L.lse_recv), out = be_.alloc(lse.dtype, blk * U, L.lse);
  // lse [1, Hq, S_l]: block j = heads of rank j, contiguous.
  all_to_all(lse, recv.flat(), blk);
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
  Buffer send = be_.alloc(lse.dtype, blk * U, labels(inner_is_ring_).lse_send);
  for (int j = 0; j < U; ++j)
    for (int64_t h = 0; h < h_per; ++h)
      be_.copy(send.flat().slice_flat((j * h_per + h) * s_local, {s_local}),
               lse_h.slice_flat(h * U * s_local + j * s_local, {s_local}));
  all_to_all(send.flat(), lse, blk);
}

UlyssesAttention::Sharded UlyssesAttention::shard_qkv(const AttentionTensors& t, int64_t b, const Heads& hs) {
  const int64_t S = t.q.dim(1), nq = hs.q_per_rank, nkv = hs.kv_per_rank;
  const UlyssesLabels& L = labels(inner_is_ring_);
  return {S,
          S * comm_.size(),
          nq,
          nkv,
          hs.hd,
          to_heads(seq(t.q, b), hs.hq, nq, false, hs, L.q),
          to_heads(seq(t.k, b), hs.hkv, nkv, true, hs, L.k),
          to_heads(seq(t.v, b), hs.hkv, nkv, true, hs, L.v)};
}

void UlyssesAttention::forward(const AttentionTensors& t) {
  check_sizes(t);
  const Heads hs = heads(t.q, t.k);
  const UlyssesLabels& L = labels(inner_is_ring_);
  for (int64_t b = 0; b < t.q.dim(0); ++b) {
    const Sharded x = shard_qkv(t, b, hs);
    Buffer oh = be_.alloc(t.o.dtype, x.Sg * x.nq * x.hd, L.o), lh = be_.alloc(t.lse.dtype, x.nq * x.Sg, L.lse);
    inner_->forward({x.qs(x.q), x.kvs(x.k), x.kvs(x.v), x.qs(oh), lh.view({1, x.nq, x.Sg}), t.scale,
                     t.docs ? t.docs + b : nullptr, t.window});
    from_heads(x.qs(oh), hs.hq, x.nq, false, hs, seq(t.o, b));
    lse_to_seq(lh.view({1, x.nq, x.Sg}), x.nq, x.S, seq(t.lse, b));
  }
}

void UlyssesAttention::backward(const AttentionTensors& t, const AttentionGrads& g) {
  check_sizes(t);
  const Heads hs = heads(t.q, t.k);
  const UlyssesLabels& L = labels(inner_is_ring_);
  for (int64_t b = 0; b < t.q.dim(0); ++b) {
    const Sharded x = shard_qkv(t, b, hs);
    Buffer oh = to_heads(seq(t.o, b), hs.hq, x.nq, false, hs, L.o);
    Buffer dh = to_heads(seq(g.dout, b), hs.hq, x.nq, false, hs, L.dout);
    Buffer lh = lse_to_heads(seq(t.lse, b), x.nq, x.S);
    Buffer dqh = be_.alloc(g.dq.dtype, x.Sg * x.nq * x.hd, L.grads),
           dkh = be_.alloc(g.dk.dtype, x.Sg * x.nkv * x.hd, L.grads),
           dvh = be_.alloc(g.dv.dtype, x.Sg * x.nkv * x.hd, L.grads);
    inner_->backward({x.qs(x.q), x.kvs(x.k), x.kvs(x.v), x.qs(oh), lh.view({1, x.nq, x.Sg}), t.scale,
                      t.docs ? t.docs + b : nullptr, t.window},
                     {x.qs(dh), x.qs(dqh), x.kvs(dkh), x.kvs(dvh)});
    from_heads(x.qs(dqh), hs.hq, x.nq, false, hs, seq(g.dq, b));
    from_heads(x.kvs(dkh), hs.hkv, x.nkv, true, hs, seq(g.dk, b));
    from_heads(x.kvs(dvh), hs.hkv, x.nkv, true, hs, seq(g.dv, b));
  }
}

}  // namespace easyctx::attention
