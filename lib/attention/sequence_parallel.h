// Sequence-parallel attention: one causal sequence split across the ranks of a group.
//
//  ZigzagRingAttention  2W chunks of c tokens; rank r holds chunks r and 2W-1-r (in that
//      order along its local sequence). K/V blocks travel the ring (send to r+1, receive from
//      r-1); at each step a local query chunk a meets a visiting key chunk b only if b <= a:
//      b == a is the causal diagonal, b < a a full block, b > a is skipped. That makes every
//      step after the first exactly half a block per rank: perfectly balanced. Partial
//      outputs merge with the LSE rule into per-chunk accumulators (fp32 for fp32/bf16 data).
//      Backward circulates dK/dV accumulators with K/V and returns them to their owner after
//      one extra hop.
//  DistFlashAttention  LightSeq's load-balanced schedule on contiguous chunks (rank r holds
//      chunk r). Query chunk a needs key chunks b <= a. Pairs with a - b <= W/2 run on the
//      query's rank, which receives K/V from r-1 .. r-W/2; pairs further apart run on the
//      key's rank (an early rank that would otherwise idle): it receives the query (and in
//      backward o, lse, dout), computes the partial result and sends it back, keeping the
//      dK/dV contribution local. Every rank then does W/2 or W/2+1 blocks instead of up to W.
//  UlyssesAttention  all-to-all from sequence-sharded [S/U, H, hd] to head-sharded
//      [S, H/U, hd], attention on the whole sequence for H/U heads (an inner strategy: local,
//      or a zigzag ring across groups for usp), all-to-all back. GQA-aware: kv heads are
//      split when U divides them, else each rank takes the one kv head its q heads read
//      (U a multiple of kv heads) and dK/dV of ranks sharing a kv head are summed.
//
//  HeadGroupedAttention  any of these (or local attention) in G passes, each on Hq/G query
//      heads and the Hkv/G key/value heads they read, packed into contiguous copies
//      (Backend::copy_2d). Heads are independent, so the result is the same; what the inner
//      strategy keeps per call (the ring's K/V double buffer and fp32 accumulators, the
//      all-to-all buffers, cuDNN's workspace) shrinks G-fold, for 1/G-sized packed copies.
//
// Tensors as in SequenceAttention: q [B, S, Hq, hd], k/v [B, S, Hkv, hd], o like q,
// lse [B, Hq, S] (this rank's tokens). Batches are processed one sequence at a time.
#pragma once
#include <memory>

#include "attention/attention.h"
#include "dist/comm.h"

namespace easyctx::attention {

class ZigzagRingAttention final : public SequenceAttention {
 public:
  ZigzagRingAttention(ops::Backend& be, dist::Comm& ring) : be_(be), ring_(ring) {}
  const char* name() const override { return "zigzag_ring"; }
  // Wall seconds the ring waits on communication: the part of each exchange that the
  // compute it overlaps did not hide (bench/ring reports it). The K/V of step s + 1 travel
  // while step s computes; the backward's dK/dV accumulators travel after it (they hold that
  // step's result).
  double comm_seconds() const { return comm_s_; }
  void reset_comm_seconds() { comm_s_ = 0; }
  void forward(const ops::Tensor& q, const ops::Tensor& k, const ops::Tensor& v, double scale, const ops::Tensor& o,
               const ops::Tensor& lse) override;
  void backward(const ops::Tensor& q, const ops::Tensor& k, const ops::Tensor& v, const ops::Tensor& o,
                const ops::Tensor& lse, const ops::Tensor& dout, double scale, const ops::Tensor& dq,
                const ops::Tensor& dk, const ops::Tensor& dv) override;

 private:
  void forward_one(const ops::Tensor& q, const ops::Tensor& k, const ops::Tensor& v, double scale,
                   const ops::Tensor& o, const ops::Tensor& lse);
  void backward_one(const ops::Tensor& q, const ops::Tensor& k, const ops::Tensor& v, const ops::Tensor& o,
                    const ops::Tensor& lse, const ops::Tensor& dout, double scale, const ops::Tensor& dq,
                    const ops::Tensor& dk, const ops::Tensor& dv);
  // Starts sending buffers [first, last] of `send` to the next rank and receiving the
  // previous rank's into `recv` (paired, so the ring never deadlocks): after the compute
  // queued so far has finished, on the comm's own stream for device backends (host backends
  // exchange here, blocking). exchange_end() waits for it; until then neither buffer set may
  // be written, and `recv` not read.
  void exchange_begin(const ops::Buffer* send, ops::Buffer* recv, int first, int last);
  void exchange_end();
  void exchange(const ops::Buffer* send, ops::Buffer* recv, int first, int last) {
    exchange_begin(send, recv, first, last);
    exchange_end();
  }
  ops::Backend& be_;
  dist::Comm& ring_;
  double comm_s_ = 0;
};

class DistFlashAttention final : public SequenceAttention {
 public:
  DistFlashAttention(ops::Backend& be, dist::Comm& group) : be_(be), comm_(group) {}
  const char* name() const override { return "dist_flash"; }
  void forward(const ops::Tensor& q, const ops::Tensor& k, const ops::Tensor& v, double scale, const ops::Tensor& o,
               const ops::Tensor& lse) override;
  void backward(const ops::Tensor& q, const ops::Tensor& k, const ops::Tensor& v, const ops::Tensor& o,
                const ops::Tensor& lse, const ops::Tensor& dout, double scale, const ops::Tensor& dq,
                const ops::Tensor& dk, const ops::Tensor& dv) override;

 private:
  // Paired exchange of one buffer (either peer may be dist::kNoPeer).
  void exchange(const ops::Tensor& send, int dst, const ops::Tensor& recv, int src);
  ops::Backend& be_;
  dist::Comm& comm_;
};

class UlyssesAttention final : public SequenceAttention {
 public:
  // `inner` runs on the head-sharded sequence; nullptr: local causal attention.
  UlyssesAttention(ops::Backend& be, dist::Comm& group, std::unique_ptr<SequenceAttention> inner = nullptr);
  const char* name() const override { return inner_is_ring_ ? "usp" : "ulysses"; }
  void forward(const ops::Tensor& q, const ops::Tensor& k, const ops::Tensor& v, double scale, const ops::Tensor& o,
               const ops::Tensor& lse) override;
  void backward(const ops::Tensor& q, const ops::Tensor& k, const ops::Tensor& v, const ops::Tensor& o,
                const ops::Tensor& lse, const ops::Tensor& dout, double scale, const ops::Tensor& dq,
                const ops::Tensor& dk, const ops::Tensor& dv) override;

 private:
  struct Heads {
    int64_t hq, hkv, hd, q_per_rank, kv_per_rank;
    int64_t kv_head_of(int rank) const;  // first kv head rank `rank` holds
  };
  Heads heads(const ops::Tensor& q, const ops::Tensor& k) const;
  // [S_l, H, hd] -> [S_l * U, h_per, hd] (gathered sequence, this rank's heads).
  ops::Buffer to_heads(const ops::Tensor& x, int64_t h_total, int64_t h_per, bool kv, const Heads& hs);
  // [S_l * U, h_per, hd] -> into x [S_l, H, hd] (accumulate: sum contributions of ranks
  // sharing a kv head).
  void from_heads(const ops::Tensor& xh, int64_t h_total, int64_t h_per, bool kv, const Heads& hs,
                  const ops::Tensor& x);
  void lse_to_seq(const ops::Tensor& lse_h, int64_t h_per, int64_t s_local, const ops::Tensor& lse);
  ops::Buffer lse_to_heads(const ops::Tensor& lse, int64_t h_per, int64_t s_local);

  ops::Backend& be_;
  dist::Comm& comm_;
  std::unique_ptr<SequenceAttention> inner_;
  bool inner_is_ring_ = false;
};

class HeadGroupedAttention final : public SequenceAttention {
 public:
  // groups must divide the key/value heads of every call (checked per call).
  HeadGroupedAttention(ops::Backend& be, std::shared_ptr<SequenceAttention> inner, int64_t groups);
  const char* name() const override { return inner_->name(); }
  int64_t groups() const { return groups_; }
  void forward(const ops::Tensor& q, const ops::Tensor& k, const ops::Tensor& v, double scale, const ops::Tensor& o,
               const ops::Tensor& lse) override;
  void backward(const ops::Tensor& q, const ops::Tensor& k, const ops::Tensor& v, const ops::Tensor& o,
                const ops::Tensor& lse, const ops::Tensor& dout, double scale, const ops::Tensor& dq,
                const ops::Tensor& dk, const ops::Tensor& dv) override;

 private:
  ops::Backend& be_;
  std::shared_ptr<SequenceAttention> inner_;
  int64_t groups_;
};

}  // namespace easyctx::attention
