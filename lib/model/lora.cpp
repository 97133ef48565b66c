#include "model/lora.h"

#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/strings.h"

namespace easyctx::model {

namespace {
constexpr const char* kNames[kLoraTargets] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                              "gate_proj", "up_proj", "down_proj"};
constexpr const char* kModules[kLoraTargets] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                "mlp.down_proj"};
}  // namespace

const char* lora_target_name(int target) { return kNames[target]; }
const char* lora_target_module(int target) { return kModules[target]; }

double LoraSpec::scale() const {
  return rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

std::vector<std::string> LoraSpec::target_modules() const {
  std::vector<std::string> out;
  for (int t = 0; t < kLoraTargets; ++t)
    if (targets[static_cast<size_t>(t)]) out.push_back(kNames[t]);
  return out;
}

// PEFT matches modules_to_save by the end of a module's name, so "norm" takes every RMSNorm
// (model.norm, input_layernorm, post_attention_layernorm, q_norm, k_norm), as LongLoRA's
// trainable_params "embed,norm" does by substring.
std::vector<std::string> LoraSpec::modules_to_save() const {
  std::vector<std::string> out;
  if (embed_tokens) out.push_back("embed_tokens");
  if (norm) out.push_back("norm");
  if (lm_head) out.push_back("lm_head");
  return out;
}

std::string LoraSpec::describe() const {
  char buf[96];
  std::snprintf(buf, sizeof buf, "rank %lld, alpha %g (scale %g%s) on ", static_cast<long long>(rank), alpha, scale(),
                rslora ? ", rslora" : "");
  const std::vector<std::string> extra = modules_to_save();
  return buf + join(target_modules(), ", ") + (extra.empty() ? "" : "; + " + join(extra, ", "));
}

LoraSpec lora_spec(const LoraConfig& c) {
  StageConfig check;
  check.lora = c;
  validate_lora(check);
  LoraSpec s;
  s.rank = c.rank;
  s.alpha = c.alpha;
  s.rslora = c.use_rslora;
  if (!s.enabled()) return s;
  for (const std::string& n : lora_names(c.targets))
    for (int t = 0; t < kLoraTargets; ++t)
      if (n == kNames[t]) s.targets[static_cast<size_t>(t)] = true;
  for (const std::string& n : lora_names(c.trainable)) {
    s.embed_tokens |= n == "embed_tokens";
    s.lm_head |= n == "lm_head";
    s.norm |= n == "norm";
  }
  return s;
}

std::string lora_difference(const LoraSpec& have, const LoraSpec& want) {
  std::vector<std::string> d;
  auto diff = [&](const std::string& what, const std::string& a, const std::string& b) {
    if (a != b) d.push_back(what + " " + a + " vs " + b);
  };
  char a[32], b[32];
  std::snprintf(a, sizeof a, "%g", have.alpha);
  std::snprintf(b, sizeof b, "%g", want.alpha);
  diff("rank", std::to_string(have.rank), std::to_string(want.rank));
  diff("alpha", a, b);
  diff("use_rslora", have.rslora ? "true" : "false", want.rslora ? "true" : "false");
  diff("targets", join(have.target_modules(), ","), join(want.target_modules(), ","));
  diff("trainable", join(have.modules_to_save(), ","), join(want.modules_to_save(), ","));
  return join(d, "; ");
}

}  // namespace easyctx::model
