// Hugging Face model folders (config.json + safetensors) <-> easyctx parameter units.
#pragma once
#include <cstdint>
#include <functional>
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

// The same checks (all before any tensor is read), then each parameter tensor converted to
// f32 in one reused host buffer and handed to sink(unit index, tensor, data), in layout
// order: the host holds the largest tensor, never the whole model (the evaluations load a
// model onto a device this way, in bf16).
void for_each_hf_tensor(const std::string& dir, const model::ParamLayout& layout,
                        const std::function<void(size_t unit, const model::ParamTensor& t, const float* data)>& sink);

// Writes dir/config.json and the weights (dtype F32 or BF16), sharded above max_shard_bytes.
void save_hf_model(const std::string& dir, const model::LlamaConfig& cfg, const model::ParamLayout& layout,
                   const std::vector<ops::Tensor>& units, StDType dtype = StDType::F32,
                   uint64_t max_shard_bytes = 5ull << 30);

}  // namespace easyctx::ckpt
