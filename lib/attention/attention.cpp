#include "attention/attention.h"

#include "attention/blocks.h"
#include "attention/documents.h"

namespace easyctx::attention {

void LocalAttention::forward(const AttentionTensors& t) {
  ops::AttentionBlock blk;
  blk.scale = t.scale;
  blk.causal = true;
  blk.window = t.window;
  if (!t.docs) {
    be_.attention_fwd(t.q, t.k, t.v, blk, t.o, t.lse);
    return;
  }
  for (int64_t b = 0; b < t.q.dim(0); ++b) {
    const AttentionTensors s = detail::seq(t, b);
    masked_attention_fwd(be_, s.docs, s.q, s.k, s.v, blk, s.o, s.lse);
  }
}

void LocalAttention::backward(const AttentionTensors& t, const AttentionGrads& g) {
  ops::AttentionBlock blk;
  blk.scale = t.scale;
  blk.causal = true;
  blk.accumulate = false;  // one block: overwrite (cuDNN writes the gradients in place)
  blk.window = t.window;
  if (!t.docs) {
    be_.attention_bwd(t.q, t.k, t.v, t.o, t.lse, g.dout, blk, g.dq, g.dk, g.dv);
    return;
  }
  for (int64_t b = 0; b < t.q.dim(0); ++b) {
    const AttentionTensors s = detail::seq(t, b);
    const AttentionGrads sg = detail::seq(g, b);
    masked_attention_bwd(be_, s.docs, s.q, s.k, s.v, s.o, s.lse, sg.dout, blk, sg.dq, sg.dk, sg.dv);
  }
}

}  // namespace easyctx::attention
