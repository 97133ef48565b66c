// The model's private pieces shared by llama.cpp (training forward/backward, the workspaces'
// lifetime), llama_head_groups.cpp (the attention block in head groups) and llama_score.cpp
// (forward-only evaluation). Not an interface: include it only from lib/model.
#pragma once
#include <cstdint>

#include "model/llama.h"

namespace easyctx::model {

// The dtype of the per-row statistics (RMSNorm rstd, attention LSE) of a compute dtype.
inline DType stat_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

// Every buffer sized for `tokens` tokens; views take their first elements, so a workspace
// serves any batch of at most that many tokens.
struct LlamaModel::ScoreWorkspace {
  int64_t tokens = 0;
  ops::Buffer x;            // [n, D]  the residual stream, updated in place layer by layer
  ops::Buffer h;            // [n, D]  input norm output, then the O projection, then the MLP norm output;
                            //         finally the final norm output the LM head reads
  ops::Buffer q, k, v, o;   // [n, Hq*hd], [n, Hkv*hd] x2, [n, Hq*hd]
  ops::Buffer lse;          // [B, Hq, S] stat dtype (the attention's, unused after it)
  ops::Buffer rstd;         // [n] stat dtype (the norms', unused)
  ops::Buffer g, u, m;      // [mlp rows, I]
  ops::Buffer down;         // [mlp rows, D]  the MLP output of one tile, before the residual add
};

// One layer's activations, all [n, ...] with n = batch * seq tokens. With head groups G > 1,
// q, k, v, o and lse hold one head group ([n, Hq/G hd], ..., [B, Hq/G, S]), or, with
// checkpoint none, every group one after the other (group-major: [G][n][Hq/G hd], ...).
struct LlamaModel::LayerActs {
  ops::Buffer h1;     // [n, D]  input RMSNorm output
  ops::Buffer rstd1;  // [n]     stat dtype
  ops::Buffer q;      // [n, Hq*hd] after RoPE
  ops::Buffer k;      // [n, Hkv*hd] after RoPE
  ops::Buffer v;      // [n, Hkv*hd]
  ops::Buffer o;      // [n, Hq*hd] attention output
  ops::Buffer lse;    // [B, Hq, S] stat dtype
  ops::Buffer x_mid;  // [n, D]  residual after attention
  ops::Buffer h2;     // [mlp rows, D]  post-attention RMSNorm output (one MLP tile's rows, or all n)
  ops::Buffer rstd2;  // [n]
  ops::Buffer g, u;   // [mlp rows, I]  gate and up projections (one MLP tile, or all n rows)
  ops::Buffer m;      // [mlp rows, I]  silu(g) * u
};

// Where checkpoint l lives when the first K of them go to host memory: checkpoints 0..K+1
// share a ring of two device slots (l % 2; 0..K-1 leave for the host while the next layer
// computes and come back one layer ahead of the backward), K+2.. have slots of their own
// (slot l - K). K = 0 is "nothing offloaded": slot l for every l.
struct OffloadRing {
  int64_t K = 0;
  size_t slot(int64_t l) const { return static_cast<size_t>(l <= K + 1 ? l % 2 : l - K); }
  bool offloaded(int64_t l) const { return l < K; }
  // Device slots for checkpoints 0..last.
  size_t slots(int64_t last) const { return static_cast<size_t>(last <= K + 1 ? std::min<int64_t>(2, last + 1) : last + 1 - K); }
};

// Layer inputs that leave the device: offload_layers, at most L - 1 (the last layer's input,
// which the backward starts with, never travels).
inline int64_t offloaded_inputs(const ModelOptions& o, int64_t L) {
  const int64_t all = std::max<int64_t>(0, L - 1);
  return (o.offload_layers <= 0 || o.offload_layers > all) ? all : o.offload_layers;
}

// The first layer that keeps its attention output (checkpoint AttentionOutput): the last
// attention_output_layers of L keep theirs (0 or more than L: all, so 0).
inline int64_t first_kept_output(const ModelOptions& o, int64_t L) {
  return (o.attention_output_layers <= 0 || o.attention_output_layers >= L) ? 0 : L - o.attention_output_layers;
}

struct LlamaModel::Workspace {
  int64_t batch = 0, seq = 0;
  bool backward = false;
  bool offload = false;         // backward with offload_checkpoints
  OffloadRing ring, saved_ring; // layer inputs; kept attention outputs (index l - keep_from;
                                // those of layers below ring.K - 1 leave)
  std::vector<ops::Buffer> resid;    // [n, D] each: backward keeps L+1 (input of layer l, then the
                                // last hidden) in ring.slots(L); forward-only ping-pongs 2
  // The residual stream after l layers (l = 0: the embeddings).
  ops::Tensor stream(int64_t l, int64_t n, int64_t d) const {
    return resid[backward ? ring.slot(l) : static_cast<size_t>(l % 2)].view({n, d});
  }
  std::vector<LayerActs> acts;  // L (no checkpoint, backward) or 1 (recomputed / forward only)
  std::vector<ops::Buffer> saved_o;    // [n, Hq*hd]: attention outputs (checkpoint attention_output),
  std::vector<ops::Buffer> saved_lse;  // [B, Hq, S]: saved_ring.slots(L - 1 - keep_from) of them
  int64_t keep_from = 0;               // layers keep_from..L-1 keep theirs (first_kept_output)
  bool keeps_output(int64_t l) const { return !saved_o.empty() && l >= keep_from; }
  size_t saved_slot(int64_t l) const { return saved_ring.slot(l - keep_from); }
  bool saved_offloaded(int64_t l) const { return keeps_output(l) && saved_ring.offloaded(l - keep_from); }
  size_t saved_host(int64_t l) const { return static_cast<size_t>(l - keep_from); }  // host_o / host_lse index
  // Offload: the checkpoints that leave the device, in pinned host memory. The backward starts
  // with what the rings still hold after the forward (at least the inputs of layer L-1 and of
  // the head, the attention outputs of layers L-2 and L-1), so those never travel.
  std::vector<ops::Buffer> host_resid;           // ring.K x [n, D]: inputs of layers 0..K-1
  std::vector<ops::Buffer> host_o, host_lse;     // saved_ring.K x (saved_o, saved_lse) (streamed: one per kept layer)
  ops::CopyFence resid_out[2], saved_out[2];  // per ring slot: its last copy out (forward)
  ops::CopyFence fetched[2];                  // per ring slot: its last copy in (backward)
  // Streamed (attention_output + offload with head groups > 1): every layer's o and LSE live in
  // host memory (host_o, host_lse: L of them, group-major), each group's leaving as soon as it
  // is computed and coming back when the backward needs it, through two group-sized device
  // slots (saved_o, saved_lse: 2 of [n, Hq/G hd], [B, Hq/G, S]); so the device holds 2/G of one
  // layer's attention output, not the ring's two whole layers.
  bool streamed = false;
  size_t stream_next = 0;              // the slot the next group uses (they alternate)
  size_t take_stream_slot() {
    const size_t s = stream_next;
    stream_next ^= 1;
    return s;
  }
  ops::CopyFence stream_fence[2];      // per slot: its last copy, out or in (one copy stream)
  // Layer l's attention-output checkpoint (group-major): its device slot, or, streamed, its
  // host buffers (attention_forward_grouped and _backward_grouped then go through the slots).
  ops::Tensor saved_o_of(int64_t l) const {
    return (streamed ? host_o[saved_host(l)] : saved_o[saved_slot(l)]).flat();
  }
  ops::Tensor saved_lse_of(int64_t l) const {
    return (streamed ? host_lse[saved_host(l)] : saved_lse[saved_slot(l)]).flat();
  }
  ops::Buffer hf, rstd_f;            // [n, max(D, Hq*hd)], [n]: final norm (hf: then dattn in backward)
  ops::Buffer dx, dh;                // [n, D]: residual gradient, projection input gradient
  ops::Buffer dm, dg, du;            // [mlp rows, I] (one MLP tile)
  ops::Buffer dq, dk, dv;            // [n, Hq*hd], [n, Hkv*hd] x2 (head groups G > 1: one group's)
  // (the gradient of the attention output, [n, Hq*hd] or one group's, lives in hf: see visit_workspace)
  ops::Buffer wo, dwo;               // G > 1: one group's columns of W_O [D, Hq/G hd] (parameter
                                // dtype) and of its gradient (gradient dtype, backward only)
};

}  // namespace easyctx::model
