// LightSeq's distributed attention (DistFlashAttention): a load-balanced schedule on
// contiguous chunks (rank r holds chunk r). Query chunk a needs key chunks b <= a. Pairs
// with a - b <= W/2 run on the query's rank, which receives K/V from r-1 .. r-W/2; pairs
// further apart run on the key's rank (an early rank that would otherwise idle): it receives
// the query (and in backward o, lse, dout), computes the partial result and sends it back,
// keeping the dK/dV contribution local. Every rank then does W/2 or W/2+1 blocks instead of
// up to W. Works for any W, odd included. With a sliding window, the offsets t whose chunk
// pairs lie wholly before the window ((t - 1) c + 1 >= window) are neither exchanged nor computed.
//
// Tensors as in AttentionTensors (attention.h): q [B, S, Hq, hd], k/v [B, S, Hkv, hd], o like q,
// lse [B, Hq, S] (this rank's tokens). Batches are processed one sequence at a time.
#pragma once
#include "attention/attention.h"
#include "dist/comm.h"

namespace easyctx::attention {

class DistFlashAttention final : public SequenceAttention {
 public:
  DistFlashAttention(ops::Backend& be, dist::Comm& group) : be_(be), comm_(group) {}
  const char* name() const override { return "dist_flash"; }
  void forward(const AttentionTensors& t) override;
  void backward(const AttentionTensors& t, const AttentionGrads& g) override;

 private:
  // Paired exchange of one buffer (either peer may be dist::kNoPeer), ordered with the
  // compute by fences: the host does not wait for it (an MPI comm: for the compute before it).
  // The buffers stay allocated until the compute queue has waited for it.
  void exchange(const ops::Tensor& send, int dst, const ops::Tensor& recv, int src);
  ops::Backend& be_;
  dist::Comm& comm_;
};

}  // namespace easyctx::attention
