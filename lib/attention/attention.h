// The seam between the model and sequence-parallel attention. The model hands each layer's
// local q/k/v (this rank's tokens) to a SequenceAttention; LocalAttention is the
// single-rank case (one causal block). The strategies (zigzag_ring.h, dist_flash.h,
// ulysses.h, head_grouped.h; strategy.h picks one for a stage) implement the same
// interface on top of ops::Backend::attention_fwd/bwd/merge over sub-blocks.
#pragma once
#include "ops/ops.h"

namespace easyctx::attention {

// One call's tensors, this rank's tokens (RoPE applied): q [B, S, Hq, hd], k/v [B, S, Hkv, hd],
// o [B, S, Hq, hd], lse [B, Hq, S] (fp32; fp64 in the fp64 reference). forward writes o and
// lse; backward reads them.
struct AttentionTensors {
  ops::Tensor q, k, v, o, lse;
  double scale = 0;  // softmax scale, usually 1/sqrt(hd)
};

// backward reads dout (like o) and overwrites dq, dk, dv (shapes of q, k, v).
struct AttentionGrads {
  ops::Tensor dout, dq, dk, dv;
};

class SequenceAttention {
 public:
  virtual ~SequenceAttention() = default;
  virtual const char* name() const = 0;
  virtual void forward(const AttentionTensors& t) = 0;
  virtual void backward(const AttentionTensors& t, const AttentionGrads& g) = 0;
};

// The whole causal sequence on this rank: one block.
class LocalAttention final : public SequenceAttention {
 public:
  explicit LocalAttention(ops::Backend& be) : be_(be) {}
  const char* name() const override { return "local"; }
  void forward(const AttentionTensors& t) override {
    ops::AttentionBlock blk;
    blk.scale = t.scale;
    blk.causal = true;
    be_.attention_fwd(t.q, t.k, t.v, blk, t.o, t.lse);
  }
  void backward(const AttentionTensors& t, const AttentionGrads& g) override {
    ops::AttentionBlock blk;
    blk.scale = t.scale;
    blk.causal = true;
    blk.accumulate = false;  // one block: overwrite (cuDNN writes the gradients in place)
    be_.attention_bwd(t.q, t.k, t.v, t.o, t.lse, g.dout, blk, g.dq, g.dk, g.dv);
  }

 private:
  ops::Backend& be_;
};

}  // namespace easyctx::attention
