// Hugging Face model folders (config.json + safetensors) <-> easyctx parameter units.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "model/llama_config.h"
#include "model/param_layout.h"
#include "ops/tensor.h"

namespace easyctx::ckpt {

// Fills host unit buffers (f32 or f64, one per layout unit) from the safetensors in `dir`
// (one file or sharded). Checks every tensor's presence, dtype and shape against the
// layout; all missing, unexpected and mismatched tensors are named in one InputError. Every
// weight must be finite once loaded: NaN or Inf (or an F64 value beyond f32 when loading f32)
// is an InputError naming each such tensor, its file and the index of its first bad value.
void load_hf_weights(const std::string& dir, const model::ParamLayout& layout, const std::vector<ops::Tensor>& units);

// Writes dir/config.json and the weights (dtype F32 or BF16), sharded above max_shard_bytes.
void save_hf_model(const std::string& dir, const model::LlamaConfig& cfg, const model::ParamLayout& layout,
                   const std::vector<ops::Tensor>& units, StDType dtype = StDType::F32,
                   uint64_t max_shard_bytes = 5ull << 30);

}  // namespace easyctx::ckpt
