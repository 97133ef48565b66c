// LoRA (lora: section; docs/training.md, "LoRA"): which projections get low-rank adapters, which
// whole tensors train beside them, and the adapters' scale. The base model stays frozen in the
// compute dtype; ParamLayout (param_layout.h) places the trainable tensors in units of their own.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace easyctx::model {

// The projections an adapter can sit on, in the order a layer's adapters are laid out.
enum LoraTarget { kLoraQ = 0, kLoraK, kLoraV, kLoraO, kLoraGate, kLoraUp, kLoraDown, kLoraTargets };

// PEFT's module name of a target ("q_proj", ..., "down_proj"), and the HF module path inside a
// decoder layer ("self_attn.q_proj", "mlp.down_proj").
const char* lora_target_name(int target);
const char* lora_target_module(int target);

struct LoraSpec {
  int64_t rank = 0;  // 0: no LoRA (every weight trains)
  double alpha = 16;
  bool rslora = false;
  std::array<bool, kLoraTargets> targets{};
  bool embed_tokens = false;  // whole tensors trained beside the adapters (PEFT's modules_to_save)
  bool lm_head = false;
  bool norm = false;  // every RMSNorm gain
  bool enabled() const { return rank > 0; }
  // The adapters' output scale: alpha / rank, or alpha / sqrt(rank) (rslora).
  double scale() const;
  // PEFT's target_modules and modules_to_save (the names of adapter_config.json).
  std::vector<std::string> target_modules() const;
  std::vector<std::string> modules_to_save() const;
  // "rank 16, alpha 32 (scale 2) on q_proj, k_proj, v_proj, o_proj; + embed_tokens, norm".
  std::string describe() const;
};

// The spec of a config's lora section (validate_lora's rules; InputError naming the key). The
// model's own rules (tied embeddings) are ParamLayout's.
LoraSpec lora_spec(const LoraConfig& c);
// Two specs describe the same trainable tensors (rank, targets, extras; not alpha): a
// checkpoint's or an adapter folder's and the config's. "" when equal, else what differs.
std::string lora_difference(const LoraSpec& have, const LoraSpec& want);

}  // namespace easyctx::model
