// parallel.zero.offload_optimizer auto: where the fp32 master weights and Adam moments live,
// decided by the plan before anything is allocated (plan_memory), and the one placement all
// ranks of a job take from their plans (placement_of, agree_placement, apply_placement); then
// activation.checkpoint auto, chosen the same way (choose_checkpoint, agree_checkpoint,
// apply_checkpoint). plan_memory also adds, to a `layer` run that fits on GPUs, the
// attention-output hint.
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/strings.h"
#include "model/param_layout.h"
#include "plan/memory_plan.h"
#include "plan/plan_detail.h"

namespace easyctx::plan {
namespace {

// A decimal integer of a choice report ("gpu 12", "attention_output 0 -1"): optional '-', digits.
bool parse_int64(const std::string& x, int64_t& v) {
  const size_t digits = !x.empty() && x[0] == '-' ? 1 : 0;
  if (x.size() <= digits || x.size() > 18 || x.find_first_not_of("0123456789", digits) != std::string::npos)
    return false;
  v = std::stoll(x);
  return true;
}

// `cfg` with the inputs of its first `k` layers in pinned host memory.
void offload_layer_inputs(StageConfig& cfg, int64_t k) {
  cfg.activation.offload = OffloadTarget::Cpu;
  cfg.activation.offload_layers = k;
}

// The least k in [1, layers - 1] whose plan_with(k) fits the GPU, by bisection (the GPU bytes
// fall as k rises), with that plan in `plan` when it fits the host too; 0 (plan untouched)
// when none fits.
template <class PlanWith>
int64_t least_count_that_fits(int64_t layers, const PlanWith& plan_with, MemoryPlan& plan) {
  int64_t lo = 1, hi = layers - 1;
  MemoryPlan at_hi = plan_with(hi);  // the plan at hi, which fits the GPU
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
  return least_count_that_fits(layers, plan_with, plan);
}

// The split (stage 0 on a GPU): the fewest last layers whose optimizer state, moved to host
// memory with the head's, let `cfg` (optimizer on the GPU) fit `t`, with that plan in `plan`;
// 0 (plan untouched) when none does. The GPU bytes fall as the count rises and the host bytes
// grow: the least count that fits the GPU is the only candidate. The forward reaches the host
// units last, so the previous step's host AdamW has the forward of the first layers to finish
// in: qwen2.5-7b at 32K on one H200 keeps ~3/4 of its 7.6B parameters' state on the GPU.
int64_t least_host_state_layers(const StageConfig& cfg, const PlanTarget& t, MemoryPlan& plan) {
  if (cfg.parallel.zero.stage != 0) return 0;
  const int64_t layers = detail::plan_model(cfg.model, nullptr).num_layers;
  if (layers < 2) return 0;
  const auto plan_with = [&](int64_t k) {
    StageConfig c = cfg;
    c.parallel.zero.offload_optimizer = true;
    c.parallel.zero.offload_optimizer_layers = k;
    return detail::plan_core(c, t);
  };
  return least_count_that_fits(layers, plan_with, plan);
}

// A split that leaves more than half the layers' state in host memory (an 8B model at 32K on
// an 80 GB GPU): its host AdamW, ~0.3 ns a parameter at a host's ~96 GB/s, outlasts the next
// forward (~0.15 ns a parameter at 32K). With activation.offload none, layer inputs moved to
// pinned host memory (copies that hide behind the layers' compute) make room for more layers'
// state on the GPU: the fewest inputs that give the fewest host layers. Returns the host layers
// (`k` and `plan` untouched when that gives none fewer), the inputs moved in `inputs`.
int64_t fewer_host_layers_by_inputs(const StageConfig& c, const PlanTarget& t, int64_t k, MemoryPlan& plan,
                                    int64_t& inputs) {
  const int64_t layers = detail::plan_model(c.model, nullptr).num_layers;
  if (2 * k <= layers || c.activation.offload != OffloadTarget::None ||
      c.activation.checkpoint == CheckpointPolicy::None)
    return k;
  StageConfig all = c;
  offload_layer_inputs(all, layers - 1);
  MemoryPlan q;
  const int64_t fewer = least_host_state_layers(all, t, q);
  if (fewer == 0 || fewer >= k) return k;
  StageConfig split = c;
  split.parallel.zero.offload_optimizer = true;
  split.parallel.zero.offload_optimizer_layers = fewer;
  const int64_t j = least_offload_layers(split, t, q);  // (layers - 1 inputs fit: j >= 1)
  if (j == 0) return k;
  plan = std::move(q);
  inputs = j;
  return fewer;
}

// The note of a split placement: k layers' state in host memory, with `inputs` layer inputs moved
// (need: the GPU bytes of the whole optimizer there).
std::string split_note(const MemoryPlan& p, int64_t layers, int64_t k, int64_t inputs, int64_t need) {
  using detail::gib;
  const std::string moved = inputs > 0 ? ", activation.offload cpu, activation.offload_layers " +
                                             std::to_string(inputs) + ": the inputs of the first " +
                                             std::to_string(inputs) + " layers in pinned host memory make room"
                                       : "";
  return "parallel.zero.offload_optimizer auto: split: the fp32 master weights and Adam moments of the embedding and "
         "the first " +
         std::to_string(layers - k) + " layers on the GPU, of the last " + std::to_string(k) +
         " layers and the head in host memory (parallel.zero.offload_optimizer_layers " + std::to_string(k) + moved +
         "; the run fits: " + gib(p.gpu_peak_bytes) + " of " + gib(p.gpu_usable) +
         " usable per GPU; with all of it on the GPU it would need " + gib(need) + ")";
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
    p.notes.push_back("parallel.zero.offload_optimizer auto: on the GPU (the run fits with it: " +
                      gib(p.gpu_peak_bytes) + " of " + gib(p.gpu_usable) + " usable per GPU)");
    if (!p.fits) p.knobs = detail::search_knobs(c, target, p.tokens);
    return p;
  }
  const int64_t need = p.gpu_peak_bytes, usable = p.gpu_usable;
  // Next, the optimizer on the GPU with the fewest layer inputs moved to pinned host memory
  // that make room for it (activation.offload none, the default, only: a set offload is the
  // user's). Their copies overlap the layers' compute (a layer's input is tokens x hidden x 2
  // bytes; its compute is ~24 x hidden^2 FLOPs per token), so they cost far less than a host
  // AdamW: llama2-7b at 64K on one H200, 4,602 tok/s this way against ~4,250 with the optimizer
  // in host memory (bench/RESULTS.md, 2026-12-02).
  if (const int64_t k = least_offload_layers(c, target, p); k > 0) {
    p.auto_offload_layers = k;
    p.notes.push_back("parallel.zero.offload_optimizer auto: on the GPU, with the inputs of the first " +
                      std::to_string(k) + " layers in pinned host memory (activation.offload cpu, " +
                      "activation.offload_layers " + std::to_string(k) + "; the run fits: " + gib(p.gpu_peak_bytes) +
                      " of " + gib(p.gpu_usable) + " usable per GPU; with every layer input on the GPU it would need " +
                      gib(need) + ")");
    return p;
  }
  // Next, split: the state of the head and the fewest last layers in host memory, the rest on
  // the GPU; the host AdamW then has less to do and the forward of the GPU's layers to hide in.
  if (int64_t k = least_host_state_layers(c, target, p); k > 0) {
    int64_t inputs = 0;
    k = fewer_host_layers_by_inputs(c, target, k, p, inputs);
    p.auto_offload_layers = inputs;
    p.notes.push_back(split_note(p, detail::plan_model(cfg.model, nullptr).num_layers, k, inputs, need));
    return p;
  }
  c.parallel.zero.offload_optimizer = true;
  p = detail::plan_core(c, target);
  p.notes.push_back("parallel.zero.offload_optimizer auto: in host memory (with it on the GPU the run would need " +
                    gib(need) + " per GPU, " + gib(usable) + " usable)");
  if (!p.fits) p.knobs = detail::search_knobs(c, target, p.tokens);
  return p;
}

// activation.checkpoint auto on the plan `p` of `placed` (cfg with its optimizer placement
// written, checkpoint `layer`): the most of the last layers that keep their attention output
// (more layer inputs in pinned host memory where that keeps more: GPUs, and the user's config
// moves none), else `layer`. The result is the plan of the chosen config (p's notes first).
MemoryPlan choose_checkpoint(MemoryPlan p, StageConfig placed, const StageConfig& cfg, const PlanTarget& target) {
  placed.activation.checkpoint_auto = false;
  const int64_t layers = detail::plan_model(cfg.model, nullptr).num_layers;
  detail::KeptOutputs k =
      detail::most_kept_outputs(placed, target, p.gpu_capacity > 0 && cfg.activation.offload == OffloadTarget::None);
  if (k.kept == 0) {
    p.auto_checkpoint = "layer";
    p.notes.push_back("activation.checkpoint auto: layer (not even the last layer's attention output fits beside it)");
    return p;
  }
  MemoryPlan q = std::move(k.plan);
  q.notes = std::move(p.notes);
  q.auto_offload_layers = p.auto_offload_layers;
  const int64_t offload = k.offload < 0 ? -1 : k.offload == layers - 1 ? 0 : k.offload;
  q.auto_checkpoint =
      "attention_output " + std::to_string(k.kept == layers ? 0 : k.kept) + " " + std::to_string(offload);
  q.notes.push_back("activation.checkpoint auto: " + detail::kept_outputs_text(placed, k, false));
  return q;
}

// Layers that keep their attention output under a checkpoint choice (of a model of `layers`).
int64_t kept_layers(const std::string& choice, int64_t layers) {
  StageConfig c;
  apply_checkpoint(c, choice);
  const int64_t m = c.activation.attention_output_layers;
  return c.activation.checkpoint != CheckpointPolicy::AttentionOutput ? 0 : m == 0 || m > layers ? layers : m;
}

// The parameters whose optimizer state a split with `host_layers` layers in host memory keeps
// on the GPU: the embedding's and the first layers' (LoRA: of their trainable units only; the
// frozen base has no state), as zero/param_store.cpp's state_in_host places them.
int64_t state_on_gpu(const StageConfig& cfg, const model::LlamaConfig& m, int64_t host_layers) {
  const model::ParamLayout layout(m, model::lora_spec(cfg.lora));
  int64_t n = 0;
  for (size_t u = 0; u < layout.num_units(); ++u)
    if (!layout.units()[u].frozen && layout.unit_layer(u) < m.num_layers - host_layers) n += layout.units()[u].numel;
  return n;
}

// Both autos: the optimizer's place was chosen first (the GPU when it fits there, perhaps with
// layer inputs moved out); with it in host memory more layers may keep their attention output.
// That wins when the attention forwards they no longer recompute outlast the host update, both
// estimated from measurement on one H200 (bench/RESULTS.md): the causal forward at ~550 TFLOP/s
// (2 x tokens x seq_length x q_dim FLOPs per layer and micro-batch), the host AdamW's cost net of its overlap
// with the next forward ~0.18 ns per parameter on the rank (llama2-7b at 64K, 16 host threads:
// ~1.2 s per step, bench/RESULTS.md, 2026-12-02). llama2-7b at 128K: 31 more layers, ~7.9 s against ~1.2 s.
// A split placement (offload_optimizer_layers) is weighed the same way, with only the
// parameters whose state it keeps on the GPU counted as the host update it saves.
MemoryPlan weigh_host_optimizer(MemoryPlan on_gpu, const StageConfig& cfg, const PlanTarget& target) {
  constexpr double kAttentionFlopsPerSecond = 550e12, kHostUpdateSecondsPerParam = 0.18e-9;
  const model::LlamaConfig m = detail::plan_model(cfg.model, nullptr);
  const int64_t layers = m.num_layers;
  if (kept_layers(on_gpu.auto_checkpoint, layers) == layers) return on_gpu;
  StageConfig h = cfg;
  h.parallel.zero.offload_optimizer_auto = false;
  h.parallel.zero.offload_optimizer = true;
  MemoryPlan ph = detail::plan_core(h, target);
  if (!ph.fits) return on_gpu;
  MemoryPlan host = choose_checkpoint(std::move(ph), h, cfg, target);
  const int64_t more = kept_layers(host.auto_checkpoint, layers) - kept_layers(on_gpu.auto_checkpoint, layers);
  const double saved_s = static_cast<double>(more) * 2.0 * static_cast<double>(on_gpu.tokens) *
                         static_cast<double>(cfg.train.grad_accum) * static_cast<double>(cfg.data.seq_length) *
                         static_cast<double>(m.q_dim()) / kAttentionFlopsPerSecond;
  const double per_rank = on_gpu.offload_optimizer  // (a split: the embedding's and the first layers' state)
                              ? static_cast<double>(state_on_gpu(cfg, m, on_gpu.offload_optimizer_layers))
                              : static_cast<double>(on_gpu.trainable_parameters) /
                                    static_cast<double>(cfg.parallel.zero.stage == 3 ? on_gpu.zero_group : 1);
  const double host_s = per_rank * kHostUpdateSecondsPerParam;
  if (more <= 0 || saved_s <= host_s) return on_gpu;
  char why[240];
  std::snprintf(why, sizeof why,
                "parallel.zero.offload_optimizer auto: in host memory, so that %lld more layers keep "
                "their attention output (activation.checkpoint auto): ~%.1f s of attention forward saved per step "
                "against ~%.1f s of host update",
                static_cast<long long>(more), saved_s, host_s);
  host.notes.insert(host.notes.begin(), why);
  return host;
}

}  // namespace

// The plan with the optimizer placed and activation.checkpoint auto resolved; a `layer` run
// that fits on GPUs also gets the note that says how many layers could keep their attention
// output instead (speed the memory allows).
MemoryPlan plan_memory(const StageConfig& cfg, const PlanTarget& target) {
  MemoryPlan p = place_optimizer(cfg, target);
  if (!p.fits) return p;
  StageConfig placed = cfg;
  apply_placement(placed, placement_of(p));
  if (cfg.activation.checkpoint_auto) {
    MemoryPlan a = choose_checkpoint(std::move(p), std::move(placed), cfg, target);
    const bool weigh = cfg.parallel.zero.offload_optimizer_auto &&
                       (!a.offload_optimizer || a.offload_optimizer_layers > 0) && a.gpu_capacity > 0;
    return weigh ? weigh_host_optimizer(std::move(a), cfg, target) : a;
  }
  if (p.gpu_capacity > 0 && cfg.activation.checkpoint == CheckpointPolicy::Layer)
    if (std::string hint = detail::kept_outputs_hint(placed, target); !hint.empty()) p.notes.push_back(std::move(hint));
  return p;
}

std::string placement_of(const MemoryPlan& p) {
  if (!p.offload_optimizer) return "gpu " + std::to_string(p.auto_offload_layers);
  if (p.offload_optimizer_layers <= 0) return "host";
  return "host " + std::to_string(p.offload_optimizer_layers) +
         (p.auto_offload_layers > 0 ? " " + std::to_string(p.auto_offload_layers) : "");
}

namespace {
// A placement report as {host memory (the whole state or a split), layers whose state is in
// host memory (a split; 0: all), layer inputs moved out}: "host" {true, 0, 0}, "host K" and
// "host K J" (K > 0, J > 0) {true, K, J}, "gpu J" (J >= 0) {false, 0, J}.
struct Placement {
  bool host = false;
  int64_t host_layers = 0, inputs = 0;
};
Placement parse_placement(const std::string& r) {
  const std::vector<std::string> f = split(r, ' ');
  Placement p;
  bool ok = false;
  if (!f.empty() && f[0] == "host" && f.size() <= 3) {
    p.host = true;
    ok = f.size() == 1 || (parse_int64(f[1], p.host_layers) && p.host_layers > 0 &&
                           (f.size() == 2 || (parse_int64(f[2], p.inputs) && p.inputs > 0)));
  } else if (f.size() == 2 && f[0] == "gpu") {
    ok = parse_int64(f[1], p.inputs) && p.inputs >= 0;
  }
  EASYCTX_CHECK(ok, "optimizer placement report '", r, "': expected 'host', 'host K', 'host K J' or 'gpu J'");
  return p;
}
}  // namespace

int64_t placement_offload_layers(const std::string& placement) { return parse_placement(placement).inputs; }

int64_t placement_optimizer_layers(const std::string& placement) { return parse_placement(placement).host_layers; }

void apply_placement(StageConfig& cfg, const std::string& placement) {
  const Placement p = parse_placement(placement);
  cfg.parallel.zero.offload_optimizer = p.host;
  cfg.parallel.zero.offload_optimizer_layers = p.host_layers;
  cfg.parallel.zero.offload_optimizer_auto = false;
  if (p.inputs > 0) offload_layer_inputs(cfg, p.inputs);
}

std::string agree_placement(const std::vector<std::string>& reports) {
  Placement most;
  for (const std::string& r : reports) {
    const Placement p = parse_placement(r);  // (checks every report)
    if (p.host && p.host_layers == 0) return "host";
    most.host = most.host || p.host;
    most.host_layers = std::max(most.host_layers, p.host_layers);
    most.inputs = std::max(most.inputs, p.inputs);
  }
  if (!most.host) return "gpu " + std::to_string(most.inputs);
  return "host " + std::to_string(most.host_layers) + (most.inputs > 0 ? " " + std::to_string(most.inputs) : "");
}

void apply_checkpoint(StageConfig& cfg, const std::string& choice) {
  const std::vector<std::string> f = split(choice, ' ');
  int64_t kept = 0, offload = 0;
  const bool kept_outputs = f.size() == 3 && f[0] == "attention_output" && parse_int64(f[1], kept) && kept >= 0 &&
                            parse_int64(f[2], offload) && offload >= -1;
  EASYCTX_CHECK(choice == "layer" || kept_outputs, "checkpoint choice '", choice,
                "': expected 'layer' or 'attention_output M K' (M >= 0, K >= -1)");
  cfg.activation.checkpoint_auto = false;
  cfg.activation.checkpoint = kept_outputs ? CheckpointPolicy::AttentionOutput : CheckpointPolicy::Layer;
  cfg.activation.attention_output_layers = kept;
  if (offload >= 0) offload_layer_inputs(cfg, offload);
}

std::string agree_checkpoint(const std::vector<std::string>& reports) {
  StageConfig check;
  for (const std::string& r : reports) apply_checkpoint(check, r);  // (checks every report)
  for (const std::string& r : reports)
    if (r != reports.front()) return "layer";
  return reports.empty() ? "layer" : reports.front();
}

}  // namespace easyctx::plan
