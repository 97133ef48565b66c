// Attention in head groups (activation.attention_head_groups: G).
//
// Any strategy (or local attention) in G passes, each on Hq/G query heads and the Hkv/G
// key/value heads they read, packed into contiguous copies (Backend::copy_2d). Heads are
// independent, so the result is the same; what the inner strategy keeps per call (the
// ring's K/V double buffer and fp32 accumulators, the all-to-all buffers, cuDNN's workspace)
// shrinks G-fold, for 1/G-sized packed copies.
//
// Tensors as in AttentionTensors (attention.h): q [B, S, Hq, hd], k/v [B, S, Hkv, hd], o like q,
// lse [B, Hq, S] (this rank's tokens). Batches are processed one sequence at a time.
#pragma once
#include <memory>

#include "attention/attention.h"

namespace easyctx::attention {

class HeadGroupedAttention final : public SequenceAttention {
 public:
  // groups must divide the key/value heads of every call (checked per call).
  HeadGroupedAttention(ops::Backend& be, std::shared_ptr<SequenceAttention> inner, int64_t groups);
  const char* name() const override { return inner_->name(); }
  int64_t groups() const { return groups_; }
  // The strategy each group's pass calls (LlamaModel tiles its attention block over head
  // groups itself and calls this one on each group's own q, k, v, o).
  const std::shared_ptr<SequenceAttention>& inner() const { return inner_; }
  void forward(const AttentionTensors& t) override;
  void backward(const AttentionTensors& t, const AttentionGrads& g) override;

 private:
  ops::Backend& be_;
  std::shared_ptr<SequenceAttention> inner_;
  int64_t groups_;
};

}  // namespace easyctx::attention
