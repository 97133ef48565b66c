// The seam between the model and sequence-parallel attention. The model hands each layer's
// local q/k/v (this rank's tokens) to a SequenceAttention; LocalAttention is the
// single-rank case (one causal block). The strategies (zigzag_ring.h, dist_flash.h,
// ulysses.h, head_grouped.h; strategy.h picks one for a stage) implement the same
// interface on top of ops::Backend::attention_fwd/bwd/merge over sub-blocks.
#pragma once
#include <vector>

#include "ops/ops.h"

namespace easyctx::attention {

// Documents packed into one sequence (data.document_mask): the first position of each, in the
// sequence's global coordinates (the padded window's, those of AttentionBlock::q_offset and
// k_offset), increasing, the first 0. A query attends to the keys of its own document only.
// Empty or {0}: one document, plain causal attention. (attention/documents.h runs it.)
using DocumentStarts = std::vector<int64_t>;

// One call's tensors, this rank's tokens (RoPE applied): q [B, S, Hq, hd], k/v [B, S, Hkv, hd],
// o [B, S, Hq, hd], lse [B, Hq, S] (fp32; fp64 in the fp64 reference). forward writes o and
// lse; backward reads them.
struct AttentionTensors {
  ops::Tensor q, k, v, o, lse;
  double scale = 0;                      // softmax scale, usually 1/sqrt(hd)
  const DocumentStarts* docs = nullptr;  // [B], one per sequence; nullptr: no document mask
  int64_t window = 0;                    // sliding window (ops::AttentionBlock::window); 0: none
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

// The whole causal sequence on this rank: one block (with documents: one causal block per
// document, attention/documents.h).
class LocalAttention final : public SequenceAttention {
 public:
  explicit LocalAttention(ops::Backend& be) : be_(be) {}
  const char* name() const override { return "local"; }
  void forward(const AttentionTensors& t) override;
  void backward(const AttentionTensors& t, const AttentionGrads& g) override;

 private:
  ops::Backend& be_;
};

}  // namespace easyctx::attention
