// The model's private pieces shared by llama.cpp (training forward/backward, the workspaces'
// lifetime), llama_head_groups.cpp (the attention block in head groups) and llama_score.cpp
// (forward-only evaluation). Not an interface: include it only from lib/model.
#pragma once
#include <cstdint>

#include "model/activation_store.h"
#include "model/llama.h"

namespace easyctx::model {

// The dtype of the per-row statistics (RMSNorm rstd, attention LSE) of a compute dtype.
inline DType stat_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

// Group g's part of a group-major checkpoint (head groups: [G][per] elements), as a flat view.
inline ops::Tensor group_part(const ops::Tensor& t, int64_t g, int64_t per) {
  return t.reshape({t.numel()}).slice_flat(g * per, {per});
}

// Every buffer sized for `tokens` tokens; views take their first elements, so a workspace
// serves any batch of at most that many tokens.
struct LlamaModel::ScoreWorkspace {
  int64_t tokens = 0;
  ops::Buffer x;           // [n, D]  the residual stream, updated in place layer by layer
  ops::Buffer h;           // [n, D]  input norm output, then the O projection, then the MLP norm output;
                           //         finally the final norm output the LM head reads
  ops::Buffer q, k, v, o;  // [n, Hq*hd], [n, Hkv*hd] x2, [n, Hq*hd]
  ops::Buffer lse;         // [B, Hq, S] stat dtype (the attention's, unused after it)
  ops::Buffer rstd;        // [n] stat dtype (the norms', unused)
  ops::Buffer g, u, m;     // [mlp rows, I]
  ops::Buffer down;        // [mlp rows, D]  the MLP output of one tile, before the residual add
  ops::Buffer ones;        // [n] ones (qkv_bias: the bias add as a rank-one product)
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

// The model's own buffers of a training step or forward-only pass (the checkpoints are the
// ActivationStore's): the layer activations and the backward's gradient scratch.
struct LlamaModel::Workspace {
  int64_t batch = 0, seq = 0;
  bool backward = false;
  std::vector<LayerActs> acts;  // L (no checkpoint, backward) or 1 (recomputed / forward only)
  ops::Buffer head_in, rstd_f;  // [n, max(D, Hq*hd)], [n]: the final norm's output (the LM head's
                                // input; in backward the attention-output gradient), its rstd
  ops::Buffer dx, dh;           // [n, D]: residual gradient, projection input gradient
  ops::Buffer dm, dg, du;       // [mlp rows, I] (one MLP tile)
  ops::Buffer dq, dk, dv;       // [n, Hq*hd], [n, Hkv*hd] x2 (head groups G > 1: one group's)
  ops::Buffer wo, dwo;          // G > 1: one group's columns of W_O [D, Hq/G hd] (parameter
                                // dtype) and of its gradient (gradient dtype, backward only)
  ops::Buffer ones;             // [n] ones (qkv_bias: bias add and gradient as rank-one products)
};

}  // namespace easyctx::model
