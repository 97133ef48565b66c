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
// The most of the last layers of a `layer` run that fit keeping their attention output
// (checkpoint attention_output, activation.attention_output_layers), with the config's
// activation offload as it is (offload -1) or, move_inputs, with the fewest more layer inputs
// in pinned host memory that keep the most (offload = that activation.offload_layers); kept 0
// when not even one fits. plan: the plan of that config; as_is: the most with the offload as it is.
struct KeptOutputs {
  int64_t kept = 0, offload = -1, as_is = 0;
  MemoryPlan plan;
};
KeptOutputs most_kept_outputs(const StageConfig& cfg, const PlanTarget& t, bool move_inputs);
// "attention_output[ with ... N][, activation.offload cpu, ...] (X of Y GiB ...): ..." for the
// notes; hint: in the conditional ("would fit too", "would skip").
std::string kept_outputs_text(const StageConfig& cfg, const KeptOutputs& k, bool hint);
// A `layer` run that fits on GPUs (cfg with its optimizer placement written): the note that
// names the most layers that could keep their attention output instead, or "" when not even one fits.
std::string kept_outputs_hint(const StageConfig& cfg, const PlanTarget& t);

inline std::string gib(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace easyctx::plan::detail
