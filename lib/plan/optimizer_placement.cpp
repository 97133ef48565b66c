// parallel.zero.offload_optimizer auto: where the fp32 master weights and Adam moments live,
// decided by the plan before anything is allocated (plan_memory), and the one placement all
// ranks of a job take from their plans (placement_of, agree_placement, apply_placement).
// plan_memory also adds, to a `layer` run that fits on GPUs, the attention-output hint.
#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "plan/memory_plan.h"
#include "plan/plan_detail.h"

namespace easyctx::plan {
namespace {

// `cfg` with the inputs of its first `k` layers in pinned host memory.
void offload_layer_inputs(StageConfig& cfg, int64_t k) {
  cfg.activation.offload = OffloadTarget::Cpu;
  cfg.activation.offload_layers = k;
}

// The middle way: the fewest layer inputs that, moved to pinned host memory, let `cfg` fit `t`
// with the optimizer where cfg puts it, with that plan in `plan`; 0 (plan untouched) when none
// does, or cfg sets an offload already or keeps no checkpoints. The GPU bytes fall as the count
// rises and the host bytes grow: the least count that fits the GPU is the only candidate.
int64_t least_offload_layers(const StageConfig& cfg, const PlanTarget& t, MemoryPlan& plan) {
  if (cfg.activation.offload != OffloadTarget::None || cfg.activation.checkpoint == CheckpointPolicy::None) return 0;
  const int64_t layers = detail::plan_model(cfg.model, nullptr).num_layers;
  if (layers < 2) return 0;
  const auto plan_with = [&](int64_t k) {
    StageConfig c = cfg;
    offload_layer_inputs(c, k);
    return detail::plan_core(c, t);
  };
  int64_t lo = 1, hi = layers - 1;
  MemoryPlan at_hi = plan_with(hi);  // the plan with hi layer inputs out, which fits the GPU
  if (!at_hi.gpu_fits) return 0;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    MemoryPlan q = plan_with(mid);
    if (q.gpu_fits) {
      hi = mid;
      at_hi = std::move(q);
    } else {
      lo = mid + 1;
    }
  }
  if (!at_hi.fits) return 0;
  plan = std::move(at_hi);
  return hi;
}

// The plan with the optimizer where parallel.zero.offload_optimizer puts it (auto: decided here).
MemoryPlan place_optimizer(const StageConfig& cfg, const PlanTarget& target) {
  const auto& z = cfg.parallel.zero;
  if (!z.offload_optimizer_auto || z.offload_optimizer) {
    MemoryPlan p = detail::plan_core(cfg, target);
    if (!p.fits) p.knobs = detail::search_knobs(cfg, target, p.tokens);
    return p;
  }
  // parallel.zero.offload_optimizer auto: the GPU when the run fits there with the optimizer
  // (its update is then a few ms of GPU time instead of seconds of host memory bandwidth),
  // else host memory. The knobs, if it fits neither way, are searched from the host placement.
  StageConfig c = cfg;
  c.parallel.zero.offload_optimizer_auto = false;
  MemoryPlan p = detail::plan_core(c, target);
  if (p.gpu_capacity == 0) return p;  // not a CUDA run: there is no choice (the fits are the same)
  using detail::gib;
  if (p.gpu_fits) {
    p.notes.push_back("parallel.zero.offload_optimizer auto: on the GPU (the run fits with it: " + gib(p.gpu_peak_bytes) +
                      " of " + gib(p.gpu_usable) + " usable per GPU)");
    if (!p.fits) p.knobs = detail::search_knobs(c, target, p.tokens);
    return p;
  }
  const int64_t need = p.gpu_peak_bytes, usable = p.gpu_usable;
  // Next, the optimizer on the GPU with the fewest layer inputs moved to pinned host memory
  // that make room for it (activation.offload none, the default, only: a set offload is the
  // user's). Their copies overlap the layers' compute (a layer's input is tokens x hidden x 2
  // bytes; its compute is ~24 x hidden^2 FLOPs per token), so they cost far less than a host
  // AdamW: llama2-7b at 64K on one H200, 4,602 tok/s this way against ~4,250 with the optimizer
  // in host memory (bench/RESULTS.md, session 26).
  if (const int64_t k = least_offload_layers(c, target, p); k > 0) {
    p.auto_offload_layers = k;
    p.notes.push_back("parallel.zero.offload_optimizer auto: on the GPU, with the inputs of the first " +
                      std::to_string(k) + " layers in pinned host memory (activation.offload cpu, " +
                      "activation.offload_layers " + std::to_string(k) + "; the run fits: " + gib(p.gpu_peak_bytes) +
                      " of " + gib(p.gpu_usable) + " usable per GPU; with every layer input on the GPU it would need " +
                      gib(need) + ")");
    return p;
  }
  c.parallel.zero.offload_optimizer = true;
  p = detail::plan_core(c, target);
  p.notes.push_back("parallel.zero.offload_optimizer auto: in host memory (with it on the GPU the run would need " +
                    gib(need) + " per GPU, " + gib(usable) + " usable)");
  if (!p.fits) p.knobs = detail::search_knobs(c, target, p.tokens);
  return p;
}

}  // namespace

// The plan with the optimizer placed; a `layer` run that fits on GPUs also gets the note that
// says how many layers could keep their attention output instead (speed the memory allows).
MemoryPlan plan_memory(const StageConfig& cfg, const PlanTarget& target) {
  MemoryPlan p = place_optimizer(cfg, target);
  if (p.fits && p.gpu_capacity > 0 && cfg.activation.checkpoint == CheckpointPolicy::Layer) {
    StageConfig placed = cfg;
    apply_placement(placed, placement_of(p));
    if (std::string hint = detail::kept_outputs_hint(placed, target); !hint.empty()) p.notes.push_back(std::move(hint));
  }
  return p;
}

std::string placement_of(const MemoryPlan& p) {
  return p.offload_optimizer ? "host" : "gpu " + std::to_string(p.auto_offload_layers);
}

int64_t placement_offload_layers(const std::string& placement) {
  if (placement == "host") return 0;
  EASYCTX_CHECK(placement.rfind("gpu ", 0) == 0 && placement.size() > 4 &&
                    placement.find_first_not_of("0123456789", 4) == std::string::npos,
                "optimizer placement report '", placement, "': expected 'host' or 'gpu K'");
  return std::stoll(placement.substr(4));
}

void apply_placement(StageConfig& cfg, const std::string& placement) {
  const int64_t layers = placement_offload_layers(placement);
  cfg.parallel.zero.offload_optimizer = placement == "host";
  cfg.parallel.zero.offload_optimizer_auto = false;
  if (layers > 0) offload_layer_inputs(cfg, layers);
}

std::string agree_placement(const std::vector<std::string>& reports) {
  int64_t most = 0;
  for (const std::string& r : reports) {
    const int64_t k = placement_offload_layers(r);  // (checks every report, "host" too)
    if (r == "host") return r;
    most = std::max(most, k);
  }
  return "gpu " + std::to_string(most);
}

}  // namespace easyctx::plan
