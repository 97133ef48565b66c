// The seam between the model and sequence-parallel attention. The model hands each layer's
// local q/k/v (this rank's tokens) to a SequenceAttention; LocalAttention is the
// single-rank case (one causal block). Zigzag ring, Ulysses and USP implement the same
// interface on top of ops::Backend::attention_fwd/bwd/merge over sub-blocks.
#pragma once
#include "ops/ops.h"

namespace easyctx::attention {

class SequenceAttention {
 public:
  virtual ~SequenceAttention() = default;
  virtual const char* name() const = 0;
  // q [B, S, Hq, hd], k/v [B, S, Hkv, hd] (this rank's tokens, RoPE applied);
  // o [B, S, Hq, hd], lse [B, Hq, S] (fp32; fp64 in the fp64 reference).
  virtual void forward(const ops::Tensor& q, const ops::Tensor& k, const ops::Tensor& v, double scale,
                       const ops::Tensor& o, const ops::Tensor& lse) = 0;
  // Overwrites dq, dk, dv (shapes of q, k, v).
  virtual void backward(const ops::Tensor& q, const ops::Tensor& k, const ops::Tensor& v, const ops::Tensor& o,
                        const ops::Tensor& lse, const ops::Tensor& dout, double scale, const ops::Tensor& dq,
                        const ops::Tensor& dk, const ops::Tensor& dv) = 0;
};

// The whole causal sequence on this rank: one block.
class LocalAttention final : public SequenceAttention {
 public:
  explicit LocalAttention(ops::Backend& be) : be_(be) {}
  const char* name() const override { return "local"; }
  void forward(const ops::Tensor& q, const ops::Tensor& k, const ops::Tensor& v, double scale, const ops::Tensor& o,
               const ops::Tensor& lse) override {
    ops::AttentionBlock blk;
    blk.scale = scale;
    blk.causal = true;
    be_.attention_fwd(q, k, v, blk, o, lse);
  }
  void backward(const ops::Tensor& q, const ops::Tensor& k, const ops::Tensor& v, const ops::Tensor& o,
                const ops::Tensor& lse, const ops::Tensor& dout, double scale, const ops::Tensor& dq,
                const ops::Tensor& dk, const ops::Tensor& dv) override {
    ops::AttentionBlock blk;
    blk.scale = scale;
    blk.causal = true;
    blk.accumulate = false;  // one block: overwrite (cuDNN writes the gradients in place)
    be_.attention_bwd(q, k, v, o, lse, dout, blk, dq, dk, dv);
  }

 private:
  ops::Backend& be_;
};

}  // namespace easyctx::attention
