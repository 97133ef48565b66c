// PEFT LoRA adapter folders (Hugging Face PEFT's save_pretrained format): adapter_config.json
// (peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, target_modules, modules_to_save,
// lora_dropout, use_rslora, base_model_name_or_path) and adapter_model.safetensors, whose keys
// are PEFT's: "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight" [r, in],
// "...lora_B.weight" [out, r], and a modules_to_save tensor under its module's own name
// ("base_model.model.model.embed_tokens.weight", "base_model.model.model.norm.weight",
// "base_model.model.lm_head.weight"). easyctx writes them from a LoRA run (its final/,
// easyctx_convert --to peft:) and reads them to start a run (model.adapter), to merge
// (easyctx_convert --merge-lora) and to evaluate (--adapter).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "core/json.h"
#include "model/llama_config.h"
#include "model/lora.h"
#include "model/param_layout.h"
#include "ops/tensor.h"

namespace easyctx::ckpt {

// PEFT's key of a LoRA layout tensor (its hf_name with PEFT's prefix).
std::string peft_key(const model::ParamTensor& t);

class LoraAdapter {
 public:
  // Reads dir/adapter_config.json and opens dir/adapter_model.safetensors. Refuses (InputError
  // naming the file and key) what easyctx's LoRA does not compute: another peft_type, DoRA,
  // bias other than none, fan_in_fan_out, layers_to_transform, rank or alpha patterns, target
  // modules other than the seven projections, modules_to_save other than embed_tokens, norm
  // (or the norms' own names) and lm_head.
  explicit LoraAdapter(const std::string& dir);
  ~LoraAdapter();
  const std::string& dir() const { return dir_; }
  const model::LoraSpec& spec() const { return spec_; }
  // base_model_name_or_path ("" when absent).
  const std::string& base_model() const { return base_; }
  // Every tensor of `layout` (a LoRA layout of this adapter's spec) that the adapter provides
  // (the adapters, the modules_to_save copies) is present with its shape; one InputError
  // naming every missing or mismatched one.
  void check(const model::ParamLayout& layout) const;
  // Elements [a, b) of LoRA layout tensor t (an adapter or a trainable copy) into out.
  void read(const model::ParamTensor& t, int64_t a, int64_t b, float* out);
  // Merges into base tensor t (of ParamLayout(config): its elements [a, b) in data): a targeted
  // projection's weight gets scale x (B A) added, in double; a modules_to_save tensor is
  // replaced; any other is left.
  void merge(const model::ParamTensor& t, int64_t a, int64_t b, float* data);
  uint64_t bytes_read() const;

 private:
  const std::vector<float>& whole(const std::string& key, const std::vector<int64_t>& shape);
  std::string dir_, base_;
  model::LoraSpec spec_;
  std::unique_ptr<SafetensorsReader> reader_;
  std::map<std::string, std::vector<float>> cache_;  // A and B matrices read whole (they are small)
};

// Reads elements [offset, offset + length) of base unit `unit` (of ParamLayout(config)) into out.
using BaseRead = std::function<void(size_t unit, int64_t offset, int64_t length, float* out)>;

// Elements [lo, lo + n) of unit u of a LoRA layout into out: a frozen unit's and a trainable
// copy's from the base (`base`), an adapter from PEFT's initialisation (model::init_lora_range,
// `seed`); with `adapter`, every trainable unit's tensors (adapters and copies) from it instead.
void fill_lora_range(const model::ParamLayout& layout, size_t u, int64_t lo, int64_t n, float* out,
                     const BaseRead& base, LoraAdapter* adapter, uint64_t seed);
// The adapter merged into elements [lo, lo + n) of unit u of a base layout, held in out.
void merge_lora_range(const model::ParamLayout& layout, size_t u, int64_t lo, int64_t n, float* out,
                      LoraAdapter& adapter);

// Writes dir/adapter_config.json and dir/adapter_model.safetensors (F32 or BF16) from the
// trainable units of a LoRA layout (host f32 views, one per unit; a frozen unit's is not read).
// base_model: base_model_name_or_path.
void save_lora_adapter(const std::string& dir, const model::ParamLayout& layout, const std::vector<ops::Tensor>& units,
                       const std::string& base_model, StDType dtype = StDType::F32);

// A LoRA spec in a checkpoint index's meta.lora ({rank, alpha, use_rslora, targets, trainable,
// base: {init, fingerprint}}; the base is the caller's) and back (InputError naming `where`).
Json lora_spec_json(const model::LoraSpec& s);
model::LoraSpec lora_spec_from_json(const Json& l, const std::string& where);

// The identity of a base model's weights, for a LoRA checkpoint to name its base and refuse
// another: a Hugging Face folder's config.json and safetensors (file names, sizes, headers:
// every tensor's name, dtype, shape and offsets) hashed, 16 hex digits. Reads no weights.
std::string hf_fingerprint(const std::string& dir);

}  // namespace easyctx::ckpt
