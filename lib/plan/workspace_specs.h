// TEMPORARY: a private copy of LlamaModel::workspace_specs (lib/model/llama.h), which lists
// every buffer LlamaModel's workspace allocates from the same code that allocates them.
// Replace with it after the merge: delete this file and its .cpp, and in memory_plan.cpp
// change model_buffers() to call model::LlamaModel::workspace_specs with
// ModelOptions::mlp_tile set (and `using BufferSpec = model::BufferSpec;`).
//
// It mirrors LlamaModel::workspace() as of commit e9c1b51, plus activation.mlp_tile as it is
// being added (tile > 0 and < n tokens, checkpoint layer/attention_output: g, u, m, dm, dg, du
// are [tile, I] instead of [n, I]), which ModelOptions does not carry yet, hence the extra
// trailing argument.
//
// Names the plan relies on (keep them in the model's version): "resid.<l>" (the residual
// stream, L + 1 with backward), "saved_o.<l>" / "saved_lse.<l>" (attention_output
// checkpoints), "embed_grad_scratch" / "embed_grad_f32" (the f32_grads embedding backward).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/llama.h"

namespace easyctx::plan {

struct BufferSpec {
  std::string name;
  ops::DType dtype;
  int64_t numel;
};

std::vector<BufferSpec> workspace_specs(const model::LlamaConfig& cfg, const model::ModelOptions& opts,
                                        ops::DType dtype, int64_t batch, int64_t seq, bool backward,
                                        int64_t mlp_tile = 0);

}  // namespace easyctx::plan
