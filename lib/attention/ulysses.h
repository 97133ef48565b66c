// Ulysses (DeepSpeed-Ulysses) attention, and usp: Ulysses with a zigzag ring inside.
//
// All-to-all from sequence-sharded [S/U, H, hd] to head-sharded [S, H/U, hd], attention on
// the whole sequence for H/U heads (an inner strategy: local, or a zigzag ring across groups
// for usp), all-to-all back. GQA-aware: kv heads are split when U divides them, else each
// rank takes the one kv head its q heads read (U a multiple of kv heads) and dK/dV of ranks
// sharing a kv head are summed.
//
// Tensors as in AttentionTensors (attention.h): q [B, S, Hq, hd], k/v [B, S, Hkv, hd], o like q,
// lse [B, Hq, S] (this rank's tokens). Batches are processed one sequence at a time.
#pragma once
#include <memory>
#include <string>

#include "attention/attention.h"
#include "dist/comm.h"

namespace easyctx::attention {

class UlyssesAttention final : public SequenceAttention {
 public:
  // `inner` runs on the head-sharded sequence; nullptr: local causal attention. `degree`: the
  // group's size and what chose it, for the message when it does not divide the heads ("": the
  // whole sequence-parallel group, parallel.sequence.size).
  UlyssesAttention(ops::Backend& be, dist::Comm& group, std::unique_ptr<SequenceAttention> inner = nullptr,
                   std::string degree = "");
  const char* name() const override { return inner_is_ring_ ? "usp" : "ulysses"; }
  void forward(const AttentionTensors& t) override;
  void backward(const AttentionTensors& t, const AttentionGrads& g) override;

 private:
  struct Heads {
    int64_t hq, hkv, hd, q_per_rank, kv_per_rank;
    int64_t kv_head_of(int rank) const;  // first kv head rank `rank` holds
  };
  Heads heads(const ops::Tensor& q, const ops::Tensor& k) const;
  // The all-to-all of `count` elements per rank, ordered with the compute by fences (the host
  // does not wait for it; with MPI, for the compute before it). Both buffers stay allocated
  // until the compute queue has waited for it (this call's end).
  void all_to_all(const ops::Tensor& send, const ops::Tensor& recv, int64_t count);
  // [S_l, H, hd] -> [S_l * U, h_per, hd] (gathered sequence, this rank's heads), allocated
  // with the label `what`.
  ops::Buffer to_heads(const ops::Tensor& x, int64_t h_total, int64_t h_per, bool kv, const Heads& hs,
                       const char* what);
  // [S_l * U, h_per, hd] -> into x [S_l, H, hd] (accumulate: sum contributions of ranks
  // sharing a kv head).
  void from_heads(const ops::Tensor& xh, int64_t h_total, int64_t h_per, bool kv, const Heads& hs,
                  const ops::Tensor& x);
  void lse_to_seq(const ops::Tensor& lse_h, int64_t h_per, int64_t s_local, const ops::Tensor& lse);
  // Sequence b of q, k, v gathered and head-sharded, with the shapes of that layout.
  struct Sharded {
    int64_t S, Sg, nq, nkv, hd;  // local and gathered tokens, heads per rank, head dim
    ops::Buffer q, k, v;
    ops::Tensor qs(const ops::Buffer& b) const { return b.view({1, Sg, nq, hd}); }  // [1, Sg, nq, hd]
    ops::Tensor kvs(const ops::Buffer& b) const { return b.view({1, Sg, nkv, hd}); }
  };
  Sharded shard_qkv(const AttentionTensors& t, int64_t b, const Heads& hs);
  ops::Buffer lse_to_heads(const ops::Tensor& lse, int64_t h_per, int64_t s_local);

  ops::Backend& be_;
  dist::Comm& comm_;
  std::unique_ptr<SequenceAttention> inner_;
  bool inner_is_ring_ = false;
  std::string degree_;
};

}  // namespace easyctx::attention
