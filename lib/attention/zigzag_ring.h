// Zigzag ring attention: one causal sequence split across the ranks of a ring.
//
// 2W chunks of c tokens; rank r holds chunks r and 2W-1-r (in that order along its local
// sequence). K/V blocks travel the ring (send to r+1, receive from r-1); at each step a
// local query chunk a meets a visiting key chunk b only if b <= a: b == a is the causal
// diagonal, b < a a full block, b > a is skipped. That makes every step after the first
// exactly half a block per rank: perfectly balanced. Partial outputs merge with the LSE rule
// into per-chunk accumulators (fp32 for fp32/bf16 data). Backward circulates dK/dV
// accumulators with K/V and returns them to their owner after one extra hop.
// With a sliding window, a step whose blocks lie wholly before the window on every rank is
// neither computed nor sent: the K/V (and dK/dV) skip the ranks that have no use for them
// (window <= c: steps 0, 1 and W-1 only; Zigzag::steps in zigzag_ring.cpp).
//
// Tensors as in AttentionTensors (attention.h): q [B, S, Hq, hd], k/v [B, S, Hkv, hd], o like q,
// lse [B, Hq, S] (this rank's tokens). Batches are processed one sequence at a time.
#pragma once
#include "attention/attention.h"
#include "dist/comm.h"

namespace easyctx::attention {

class ZigzagRingAttention final : public SequenceAttention {
 public:
  // inside_usp: the ring across the Ulysses groups of usp (labels its buffers "usp ring ...").
  ZigzagRingAttention(ops::Backend& be, dist::Comm& ring, bool inside_usp = false)
      : be_(be), ring_(ring), inside_usp_(inside_usp) {}
  const char* name() const override { return "zigzag_ring"; }
  // Exchanges are ordered with the compute by fences (core/fence.h), so the host never waits
  // for them: the K/V of step s + 1 travel while step s computes; the backward's dK/dV
  // accumulators travel after it (they hold that step's result).
  // Comm timing (bench/ring; off by default) brings back the host-blocking exchanges: the host
  // waits for the compute before issuing each exchange and for the exchange at its end, and
  // comm_seconds() adds up the time spent issuing and waiting for the exchanges. Since the
  // host only queues the compute meanwhile, on a GPU that is about the exchanges' transfer
  // time, not the part the overlapped compute failed to hide; with MPI, the blocking
  // exchanges themselves. Off, comm_seconds() stays 0.
  void set_comm_timing(bool on) { comm_timing_ = on; }
  double comm_seconds() const { return comm_s_; }
  void reset_comm_seconds() { comm_s_ = 0; }
  void forward(const AttentionTensors& t) override;
  void backward(const AttentionTensors& t, const AttentionGrads& g) override;
  // The ring steps (0 .. W-1: the K/V of rank r - s visit rank r) in which some rank computes a
  // block, for chunks of c tokens: a step is left out when, on every rank, each of its (query
  // chunk, key chunk) pairs lies in the query's future or wholly before the sliding window (its
  // last key at or before its first query's position - window; window 0: none). The same list
  // on every rank, so the K/V of a left-out step are not sent either: they hop straight to the
  // next listed step's rank (and the backward's dK/dV with them).
  static std::vector<int> steps(int W, int64_t c, int64_t window);

 private:
  void forward_one(const AttentionTensors& t);  // one sequence: [1, S, ...]
  void backward_one(const AttentionTensors& t, const AttentionGrads& g);
  // Starts sending buffers [first, last] of `send` to the rank `hop` places on and receiving
  // those of the rank `hop` places back into `recv` (paired, so the ring never deadlocks; every
  // rank uses the same hop), after the compute
  // queued so far; a device comm runs it on its own stream, a host comm (MPI) here, blocking.
  // exchange_end() makes the compute queued from then on wait for it; until then neither
  // buffer set may be written, and `recv` not read. Both stay allocated until the compute
  // queue has waited for the exchange.
  void exchange_begin(const ops::Buffer* send, ops::Buffer* recv, int first, int last, int hop);
  void exchange_end();
  void exchange(const ops::Buffer* send, ops::Buffer* recv, int first, int last, int hop) {
    exchange_begin(send, recv, first, last, hop);
    exchange_end();
  }
  ops::Backend& be_;
  dist::Comm& ring_;
  bool inside_usp_;
  bool comm_timing_ = false;
  double comm_s_ = 0;
};

}  // namespace easyctx::attention
