// The model's private pieces shared by llama.cpp (training forward/backward, the workspaces'
// lifetime), llama_head_groups.cpp (the attention block in head groups) and llama_score.cpp
// (forward-only evaluation). Not an interface: include it only from lib/model.
#pragma once
#include <array>
#include <cstdint>

#include "core/error.h"
#include "model/activation_store.h"
#include "model/llama.h"

namespace easyctx::model {

// The dtype of the per-row statistics (RMSNorm rstd, attention LSE) of a compute dtype.
inline DType stat_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

// Group g's part of a group-major checkpoint (head groups: [G][per] elements), as a flat view.
inline ops::Tensor group_part(const ops::Tensor& t, int64_t g, int64_t per) {
  return t.reshape({t.numel()}).slice_flat(g * per, {per});
}

// Group g's part of a group-major buffer that holds either every group (G x per elements) or
// one (per elements: the same memory serves each group in turn).
inline ops::Tensor group_part(const ops::Buffer& b, int64_t g, int64_t groups, int64_t per) {
  EASYCTX_CHECK(b.numel() == per || b.numel() == groups * per, "LlamaModel: head-group buffer of ", b.numel(),
                " elements, expected ", per, " or ", groups * per);
  return b.flat().slice_flat(b.numel() == per ? 0 : g * per, {per});
}

// One layer's tensors for a call (LlamaModel::layer_params: the ParamLayout locations on the
// units acquired): parameters, their gradients (empty: frozen, no weight gradient computed,
// or a forward-only call), and the LoRA adapters of the targeted projections.
struct LayerParams {
  std::array<ops::Tensor, kLayerTensors> w, g;
  std::array<ops::Tensor, kLoraTargets> a, b, ga, gb;  // A [r, in], B [out, r]; empty: not targeted
  double scale = 0;                                    // LoraSpec::scale
  int64_t rank = 0;
  int64_t layer = 0;  // the layer's index (its attention: LlamaConfig::window_of)
  bool lora(int target) const { return !a[static_cast<size_t>(target)].empty(); }
};

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
  ops::Buffer q_lin, k_lin, q_rstd, k_rstd;  // qk_norm: the projections before their norms, rstd
};

// The projection weights of one head group (g of G; every head when G = 1): views into a
// layer unit of parameters or of gradients. Biases (qkv_bias) and norms (qk_norm: the
// whole [hd] gains, shared by every head) are empty where the model has none.
struct LlamaModel::QkvWeights {
  ops::Tensor wq, wk, wv;     // [Hq/G hd, D], [Hkv/G hd, D] x2
  ops::Tensor bq, bk, bv;     // [Hq/G hd], [Hkv/G hd] x2
  ops::Tensor qn, kn;         // [hd] x2
  ops::Tensor lbq, lbk, lbv;  // LoRA: the group's rows of B_q, B_k, B_v [Hq/G hd, r], ... (empty: not targeted)
  ops::Tensor ltq, ltk, ltv;  // LoRA: the adapters' inputs h1 A^T [n, r] (every group's)
  double lscale = 0;
};

// One group's projections: q, k after RoPE, v; with qk_norm also the norms' inputs (the
// projections' outputs) and their rstd, kept for the backward.
struct LlamaModel::QkvActs {
  ops::Tensor q, k, v;         // [n, Hq/G hd], [n, Hkv/G hd] x2
  ops::Tensor q_lin, k_lin;    // qk_norm: [n, Hq/G hd], [n, Hkv/G hd]
  ops::Tensor q_rstd, k_rstd;  // qk_norm: [n Hq/G], [n Hkv/G] stat dtype
};

// One layer's activations, all [n, ...] with n = batch * seq tokens. With head groups G > 1,
// q, k, v, o and lse hold one head group ([n, Hq/G hd], ..., [B, Hq/G, S]), or, with
// checkpoint none, every group one after the other (group-major: [G][n][Hq/G hd], ...).
struct LlamaModel::LayerActs {
  ops::Buffer h1;              // [n, D]  input RMSNorm output
  ops::Buffer rstd1;           // [n]     stat dtype
  ops::Buffer q;               // [n, Hq*hd] after RoPE
  ops::Buffer k;               // [n, Hkv*hd] after RoPE
  ops::Buffer v;               // [n, Hkv*hd]
  ops::Buffer o;               // [n, Hq*hd] attention output
  ops::Buffer lse;             // [B, Hq, S] stat dtype
  ops::Buffer q_lin, k_lin;    // qk_norm: [n, Hq*hd], [n, Hkv*hd] the projections before their norms
  ops::Buffer q_rstd, k_rstd;  // qk_norm: [n Hq], [n Hkv] stat dtype
  ops::Buffer x_mid;           // [n, D]  residual after attention
  ops::Buffer h2;              // [mlp rows, D]  post-attention RMSNorm output (one MLP tile's rows, or all n)
  ops::Buffer rstd2;           // [n]
  ops::Buffer g, u;            // [mlp rows, I]  gate and up projections (one MLP tile, or all n rows)
  ops::Buffer m;               // [mlp rows, I]  silu(g) * u
  // LoRA: each targeted projection's adapter input x A^T: [n, r] for q, k, v, o; [mlp rows, r]
  // for gate, up, down (one MLP tile's, recomputed with it).
  std::array<ops::Buffer, kLoraTargets> lora_t;
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
  // LoRA backward: scale dy B per target [n, r] (q, k, v, o: summed over head groups; the MLP's
  // tiles use the first); G > 1 with o_proj targeted: one group's columns of A_o and of its
  // gradient [r, Hq/G hd].
  std::array<ops::Buffer, 4> lora_u;
  ops::Buffer lora_ao, lora_dao;
};

}  // namespace easyctx::model
