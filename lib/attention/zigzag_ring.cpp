#include "attention/zigzag_ring.h"

#include <chrono>
#include <vector>

#include "attention/blocks.h"
#include "attention/documents.h"
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

void ZigzagRingAttention::forward(const AttentionTensors& t) {
  check_sizes(t);
  for (int64_t b = 0; b < t.q.dim(0); ++b) forward_one(seq(t, b));
}

void ZigzagRingAttention::backward(const AttentionTensors& t, const AttentionGrads& g) {
  check_sizes(t);
  for (int64_t b = 0; b < t.q.dim(0); ++b) backward_one(seq(t, b), seq(g, b));
}

namespace {
struct Zigzag {
  int W, r;
  int64_t c;  // tokens per chunk
  int64_t chunk(int rank, int i) const { return i == 0 ? rank : 2 * W - 1 - rank; }
  // Local query chunk qa against key chunk kb of rank src: the block, or false when every key
  // is in the query chunk's future (b > a); b == a is the causal diagonal, b < a a full block.
  bool block(int qa, int src, int kb, double scale, int64_t window, ops::AttentionBlock* blk) const {
    const int64_t a = chunk(r, qa), b = chunk(src, kb);
    if (b > a) return false;
    blk->scale = scale;
    blk->window = window;
    blk->causal = a == b;
    blk->q_offset = a * c;
    blk->k_offset = b * c;
    return true;
  }
  // The rank whose K/V visit at ring step s.
  int source(int s) const { return (r - s + W) % W; }
  std::vector<int> steps(int64_t window) const { return ZigzagRingAttention::steps(W, c, window); }
  // f(qa, kb, block) for every pair of a local query chunk and a visiting key chunk of rank
  // src that has a key in the query's past.
  template <class F>
  void for_each_block(int src, double scale, int64_t window, F&& f) const {
    for (int qa = 0; qa < 2; ++qa)
      for (int kb = 0; kb < 2; ++kb) {
        ops::AttentionBlock blk;
        if (block(qa, src, kb, scale, window, &blk)) f(qa, kb, blk);
      }
  }
};
Zigzag zigzag_of(const dist::Comm& ring, const Tensor& q) {
  Zigzag z{ring.size(), ring.rank(), q.dim(1) / 2};
  EASYCTX_CHECK(q.dim(1) % 2 == 0, "zigzag_ring: the local sequence (", q.dim(1),
                " tokens) must hold two equal chunks; the loader pads the sequence to a multiple of 2W");
  return z;
}
// Buffer labels (Backend::alloc's `what`, the memory plan's item names): static strings, so a
// recorder may keep the pointers. One label per kind of buffer, shared by the buffers of a pair.
struct RingLabels {
  const char *running_output, *running_lse, *block_output, *block_lse, *kv, *lse_chunks, *dq, *dkv;
};
constexpr RingLabels kRingLabels{
    "zigzag_ring running output (f32)", "zigzag_ring running LSE",
    "zigzag_ring block output",         "zigzag_ring block LSE",
    "zigzag_ring K/V double buffer",    "zigzag_ring LSE chunks",
    "zigzag_ring dQ accumulator (f32)", "zigzag_ring dK/dV accumulators (f32, travel with K/V)"};
constexpr RingLabels kUspRingLabels{
    "usp ring running output (f32)", "usp ring running LSE",
    "usp ring block output",         "usp ring block LSE",
    "usp ring K/V double buffer",    "usp ring LSE chunks",
    "usp ring dQ accumulator (f32)", "usp ring dK/dV accumulators (f32, travel with K/V)"};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

std::vector<int> ZigzagRingAttention::steps(int W, int64_t c, int64_t window) {
  const Zigzag z{W, 0, c};
  std::vector<int> v;
  for (int s = 0; s < W; ++s) {
    bool any = false;
    for (int rr = 0; rr < W && !any; ++rr)
      for (int qa = 0; qa < 2; ++qa)
        for (int kb = 0; kb < 2; ++kb) {
          const int64_t a = z.chunk(rr, qa), b = z.chunk((rr - s + W) % W, kb);
          any = any || (b <= a && (window <= 0 || b * c + c - 1 > a * c - window));
        }
    if (any) v.push_back(s);
  }
  return v;
}

void ZigzagRingAttention::exchange_begin(const Buffer* send, Buffer* recv, int first, int last, int hop) {
  const int W = ring_.size(), dst = (ring_.rank() + hop) % W, from = (ring_.rank() - hop + W) % W;
  // The exchange starts after the compute that wrote `send` and last read `recv`: on the
  // device (fences); with comm timing, the host waits for that compute first, so the time
  // measured below is the exchange alone.
  if (comm_timing_) be_.synchronize();
  else ring_.wait(be_.record());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = first; i <= last; ++i)
    ring_.send_recv(send[i].data(), static_cast<size_t>(send[i].numel()), dst, recv[i].data(),
                    static_cast<size_t>(recv[i].numel()), from, send[i].dtype());
  if (comm_timing_) comm_s_ += seconds_since(t0);
}

void ZigzagRingAttention::exchange_end() {
  if (!comm_timing_) {
    be_.wait(ring_.record());  // later compute reads `recv`, rewrites `send`: after the exchange
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  ring_.synchronize();
  comm_s_ += seconds_since(t0);
}

void ZigzagRingAttention::forward_one(const AttentionTensors& t) {
  const Tensor &q = t.q, &k = t.k, &v = t.v, &o = t.o, &lse = t.lse;
  const Zigzag z = zigzag_of(ring_, q);
  const int64_t Hq = q.dim(2), Hkv = k.dim(2), hd = q.dim(3), S = q.dim(1), c = z.c;
  const DType acc = acc_type(lse);
  // Per local query chunk: running output and LSE, merged in fp32.
  const RingLabels& L = inside_usp_ ? kUspRingLabels : kRingLabels;
  Buffer acc_o[2] = {be_.alloc(acc, c * Hq * hd, L.running_output), be_.alloc(acc, c * Hq * hd, L.running_output)};
  Buffer acc_lse[2] = {be_.alloc(lse.dtype, Hq * c, L.running_lse), be_.alloc(lse.dtype, Hq * c, L.running_lse)};
  bool started[2] = {false, false};
  Buffer o_blk = be_.alloc(q.dtype, c * Hq * hd, L.block_output), lse_blk = be_.alloc(lse.dtype, Hq * c, L.block_lse);
  // K/V of the visiting rank, double-buffered: [1, S, Hkv, hd] each.
  Buffer kv[2][2] = {{be_.alloc(k.dtype, k.numel(), L.kv), be_.alloc(v.dtype, v.numel(), L.kv)},
                     {be_.alloc(k.dtype, k.numel(), L.kv), be_.alloc(v.dtype, v.numel(), L.kv)}};
  be_.copy(kv[0][0].view({1, S, Hkv, hd}), k);
  be_.copy(kv[0][1].view({1, S, Hkv, hd}), v);

  const Tensor ob = o_blk.view({1, c, Hq, hd}), lb = lse_blk.view({1, Hq, c});
  const std::vector<int> steps = z.steps(t.window);
  for (size_t i = 0; i < steps.size(); ++i) {
    const int s = steps[i], hop = i + 1 < steps.size() ? steps[i + 1] - s : 0;
    Buffer* cur = kv[i % 2];
    if (hop > 0) exchange_begin(cur, kv[(i + 1) % 2], 0, 1, hop);  // the next step's K/V travel meanwhile
    const Tensor kc = cur[0].view({1, S, Hkv, hd}), vc = cur[1].view({1, S, Hkv, hd});
    z.for_each_block(z.source(s), t.scale, t.window, [&](int qa, int kb, const ops::AttentionBlock& blk) {
      // A block where no query and key share a document, or wholly outside the window, adds
      // nothing: no merge.
      if (!masked_attention_fwd(be_, t.docs, seq_rows(q, qa * c, c), seq_rows(kc, kb * c, c), seq_rows(vc, kb * c, c),
                                blk, ob, lb))
        return;
      const Tensor ao = acc_o[qa].view({1, c, Hq, hd}), al = acc_lse[qa].view({1, Hq, c});
      if (started[qa]) {
        be_.attention_merge(ao, al, ob, lb);
        return;
      }
      be_.copy(ao, ob);
      be_.copy(al, lb);
      started[qa] = true;
    });
    if (hop > 0) exchange_end();
  }
  for (int qa = 0; qa < 2; ++qa) {
    be_.copy(seq_rows(o, qa * c, c), acc_o[qa].view({1, c, Hq, hd}));
    copy_lse_cols(be_, lse, qa * c, acc_lse[qa].view({1, Hq, c}), false);
  }
}

void ZigzagRingAttention::backward_one(const AttentionTensors& t, const AttentionGrads& g) {
  const Tensor &q = t.q, &k = t.k, &v = t.v, &o = t.o, &lse = t.lse, &dout = g.dout;
  const Zigzag z = zigzag_of(ring_, q);
  const int64_t Hq = q.dim(2), Hkv = k.dim(2), hd = q.dim(3), S = q.dim(1), c = z.c;
  const DType acc = acc_type(lse);
  const RingLabels& L = inside_usp_ ? kUspRingLabels : kRingLabels;
  Buffer lse_ch[2] = {be_.alloc(lse.dtype, Hq * c, L.lse_chunks), be_.alloc(lse.dtype, Hq * c, L.lse_chunks)};
  for (int qa = 0; qa < 2; ++qa) copy_lse_cols(be_, lse, qa * c, lse_ch[qa].view({1, Hq, c}), true);
  // dQ and the dK/dV accumulators that travel with the visiting K/V are fp32 (for fp32 and
  // bf16 data), so rounding does not compound over the ring steps.
  Buffer dq_acc = be_.alloc(acc, q.numel(), L.dq);
  const Tensor dqa = dq_acc.view({1, S, Hq, hd});
  Buffer kv[2][4];
  for (auto& set : kv) {
    set[0] = be_.alloc(k.dtype, k.numel(), L.kv);
    set[1] = be_.alloc(v.dtype, v.numel(), L.kv);
    set[2] = be_.alloc(acc, k.numel(), L.dkv);
    set[3] = be_.alloc(acc, v.numel(), L.dkv);
  }
  be_.copy(kv[0][0].view({1, S, Hkv, hd}), k);
  be_.copy(kv[0][1].view({1, S, Hkv, hd}), v);

  const std::vector<int> steps = z.steps(t.window);
  for (size_t i = 0; i < steps.size(); ++i) {
    const int s = steps[i], hop = i + 1 < steps.size() ? steps[i + 1] - s : 0;
    Buffer *cur = kv[i % 2], *nxt = kv[(i + 1) % 2];
    if (hop > 0) exchange_begin(cur, nxt, 0, 1, hop);  // the next step's K/V travel meanwhile
    auto view = [&](int b) { return cur[b].view({1, S, Hkv, hd}); };
    const Tensor kc = view(0), vc = view(1), dkc = view(2), dvc = view(3);
    z.for_each_block(z.source(s), t.scale, t.window, [&](int qa, int kb, const ops::AttentionBlock& blk) {
      masked_attention_bwd(be_, t.docs, seq_rows(q, qa * c, c), seq_rows(kc, kb * c, c), seq_rows(vc, kb * c, c),
                           seq_rows(o, qa * c, c), lse_ch[qa].view({1, Hq, c}), seq_rows(dout, qa * c, c), blk,
                           seq_rows(dqa, qa * c, c), seq_rows(dkc, kb * c, c), seq_rows(dvc, kb * c, c));
    });
    if (hop > 0) {
      exchange_end();
      exchange(cur, nxt, 2, 3, hop);  // this step's dK/dV accumulators follow their K/V
    } else if (s > 0) {
      // The accumulators we hold belong to rank r - s: W - s more positions bring ours home.
      exchange(cur, nxt, 2, 3, z.W - s);
      be_.copy(g.dk, nxt[2].view({1, S, Hkv, hd}));
      be_.copy(g.dv, nxt[3].view({1, S, Hkv, hd}));
    } else {  // one rank, or every other step left out: our own accumulators
      be_.copy(g.dk, dkc);
      be_.copy(g.dv, dvc);
    }
  }
  be_.copy(g.dq, dqa);
}

}  // namespace easyctx::attention
