// The model's private pieces shared by llama.cpp (training forward/backward, the workspaces'
// lifetime) and llama_score.cpp (forward-only evaluation). Not an interface: include it only
// from lib/model.
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

}  // namespace easyctx::model
