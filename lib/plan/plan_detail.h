// Internal to lib/plan: the plan without the knob search (what the search re-plans), the
// search itself, and the shared formatting of byte counts.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "model/llama_config.h"
#include "plan/memory_plan.h"

namespace easyctx::plan::detail {

MemoryPlan plan_core(const StageConfig& cfg, const PlanTarget& t);
// The model a plan is for: model::resolve_llama_config, except that a model.init hf:DIR that
// is not here (a login node before the weights are downloaded) is planned with model.config's
// shape when one is given, `note` saying so (the run itself still needs the folder and checks
// that its config.json describes the same model).
model::LlamaConfig plan_model(const ModelConfig& m, std::string* note);
// Single changes that make `cfg` fit `t` (n: tokens per rank, bounds the MLP tile).
std::vector<KnobFix> search_knobs(const StageConfig& cfg, const PlanTarget& t, int64_t n);
// A `layer` run that fits on GPUs (cfg with its optimizer placement written): the note that
// names the most layers that could keep their attention output instead (checkpoint
// attention_output, activation.attention_output_layers), or "" when not even one fits.
std::string kept_outputs_hint(const StageConfig& cfg, const PlanTarget& t);

inline std::string gib(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace easyctx::plan::detail
