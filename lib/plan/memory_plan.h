// The memory plan (docs/memory-model.md): every buffer a training run allocates, per GPU and
// per host, computed from the config before anything is allocated, so a run that cannot fit
// is refused with the knobs that would make it fit, and `easyctx_train STAGE.yaml --plan`
// sizes a job on a login node.
//
// The formulas replay what the code allocates: the trainer's per-unit buffers
// (lib/train/trainer.cpp), the model's workspace (LlamaModel::workspace_specs, the same code
// that allocates it), the backends' scratch (lib/ops/cuda/cuda_backend.cpp) and the
// sequence-parallel strategies' per-call buffers (lib/attention/sequence_parallel.cpp).
// The peak is taken over phases of a step: the persistent set (weights, gradients, optimizer
// state, workspace) plus the transient buffers of one phase (LM-head tile, attention
// forward/backward of the mode, ...); "init" (loading weights, before the workspace exists)
// and the host-side phases (checkpoint staging) are phases too. On the CPU backend the
// backend's allocations are exact (tests/plan checks them to 2%); on CUDA the allocations
// are exact up to cuDNN's workspace and cub's sort scratch (estimated), and the device total
// adds a calibrated constant for the CUDA context and libraries.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/json.h"
#include "model/llama_config.h"
#include "ops/ops.h"
#include "plan/target.h"
#include "zero/param_store.h"

namespace easyctx::plan {

// The host AdamW's staging chunk (zero/param_store.h), for the plan's readers.
using zero::kOffloadChunkElems;

// Device memory the CUDA context, cuBLASLt/cuDNN handles and NCCL communicators take beyond
// the backend's own allocations (what cudaMemGetInfo sees minus memory_stats().peak_bytes).
// Calibrated on an H200 (CUDA 13.0, driver 580, cuDNN 9.19, one process per GPU): device use
// at the end of a step minus the tracked allocations was 3.57-3.73 GiB over seven 1B/7B runs
// from 32K to 256K tokens (bench/RESULTS.md, "Memory plan against measurement"); most of it
// is cuDNN's and cuBLASLt's loaded kernels. Re-measure on other GPUs or library versions
// (docs/memory-model.md, "Calibration").
constexpr int64_t kCudaContextBytes = int64_t{3686} << 20;  // 3.6 GiB
// Host memory of an easyctx_train process before its buffers (program, libraries, MPI;
// with CUDA also the driver's and runtime's host side). Calibrated estimates (VmHWM).
constexpr int64_t kHostBaselineCpuBytes = int64_t{32} << 20;
constexpr int64_t kHostBaselineCudaBytes = int64_t{1} << 30;

// Which ranks hold a plan item: all of them, or only world rank 0 (the HF export's whole
// model) or only the others (what rank 0 holds instead in a bigger item).
enum class Ranks { Every, Root, Others };
const char* to_string(Ranks r);  // "every rank", "rank 0", "ranks but 0"

struct PlanItem {
  std::string name;
  std::string where;  // "gpu" or "host"
  int64_t bytes = 0;  // per rank
  std::string formula;
  bool transient = false;  // alive only during `phase`; else from its allocation to the end
  std::string phase;       // transient: the phase; persistent: "init" (allocated before the
                           // first step) or "step" (at the first step: workspace, ...)
  bool tracked = true;     // counted by ops::Backend::memory_stats (the backend's allocations)
  Ranks ranks = Ranks::Every;
};

// Totals of one phase, per rank: the backend's allocations (gpu on CUDA, host on the CPU),
// everything on the GPU (allocations + context), everything on the host (world rank 0's;
// a rank other than 0 holds host_other_bytes), and on the node with the most (rank 0's node:
// rank 0 + the others of its node, or a node of others only).
struct PhaseTotal {
  std::string name;
  int64_t alloc_bytes = 0;
  int64_t gpu_bytes = 0;
  int64_t host_bytes = 0;
  int64_t host_other_bytes = 0;
  int64_t host_node_bytes = 0;
};

// A config change (one key, or a combination: assignments separated by spaces) that makes a
// plan that does not fit fit.
struct KnobFix {
  std::string assignment;            // "activation.mlp_tile=8192"
  std::string note;                  // "needs 4 GPUs: target.nodes=1, target.gpus_per_node=4", ...
  int64_t gpu_bytes = 0;             // the fixed plan's device total per GPU (0 on the CPU backend)
  int64_t host_bytes = 0;            // its host peak per node
  int nodes = 0, gpus_per_node = 0;  // the target it assumes (parallel.sequence.size may need more GPUs)
  std::string to_string() const;     // "--set activation.mlp_tile=8192 (131.00 GiB per GPU)"
};

struct MemoryPlan {
  PlanTarget target;
  // The run: model, layout, shapes.
  std::string model_name;
  int64_t parameters = 0;  // P
  int world = 1, dp = 1, sp = 1, zero_group = 1;
  int64_t local_len = 0;  // tokens of one sequence on one rank (padded for the SP layout)
  int64_t tokens = 0;     // n = batch x local_len per rank per micro-step
  std::vector<PlanItem> items;
  std::vector<PhaseTotal> phases;
  // Per rank: the backend-tracked peak (what memory_stats().peak_bytes reads after a step).
  int64_t alloc_peak_bytes = 0;
  std::string alloc_peak_phase;
  // Per GPU: alloc peak + context (the device total); 0 on the CPU backend.
  int64_t context_bytes = 0;
  int64_t gpu_peak_bytes = 0;
  std::string gpu_peak_phase;
  // Host: per rank (VmHWM; the larger of rank 0's and another rank's), and per node (the
  // largest phase total of a node: rank 0 with the others of its node, or a node of others;
  // host_peak_phase is that phase). Nothing is shared between ranks today (host_shared_bytes
  // is where a node-wide pinned pool would go).
  int64_t host_rank_peak_bytes = 0;
  std::string host_rank_peak_phase;
  std::string host_peak_phase;
  int64_t host_shared_bytes = 0;
  int64_t host_peak_bytes = 0;
  // Capacities: the whole device / node, and what the plan may use ((1 - headroom) x that).
  int64_t gpu_capacity = 0, gpu_usable = 0;
  int64_t host_capacity = 0, host_usable = 0;
  bool gpu_fits = true, host_fits = true, fits = true;
  // Where the plan put the fp32 master weights and Adam moments: host memory (true; CUDA only)
  // or the backend's device. With parallel.zero.offload_optimizer auto this is the plan's
  // choice (plan_memory), which the trainer applies before it allocates.
  bool offload_optimizer = false;
  // > 0 (with offload_optimizer): only the head's and the last this-many layers' state in host
  // memory, the rest on the GPU (parallel.zero.offload_optimizer_layers, set or chosen by auto).
  int64_t offload_optimizer_layers = 0;
  // > 0: parallel.zero.offload_optimizer auto kept the optimizer (or, with a split, more of it)
  // on the GPU by moving the inputs of this many layers to pinned host memory (activation.offload
  // cpu, activation.offload_layers this; the user's config had no offload); the trainer applies
  // it with the placement.
  int64_t auto_offload_layers = 0;
  // activation.checkpoint auto: what the plan chose, "layer" or "attention_output M K" (M:
  // activation.attention_output_layers, 0 = every layer; K: activation.offload_layers with
  // activation.offload cpu, -1 = the offload as it was); "" when the config did not say auto.
  std::string auto_checkpoint;
  std::vector<KnobFix> knobs;  // when !fits: single changes that fit, else a combination ("together")
  // The config keys that shape the plan, with their values ({"data.seq_length": 65536,
  // "parallel.zero.stage": 3, ...}): what a reader of plan.json needs to know what was planned.
  Json settings;
  // Things the reader should know about how the plan was made ("model.init hf:DIR is not
  // here: planned with model.config llama2-7b").
  std::vector<std::string> notes;
  // CUDA: every distinct attention call of a step with its route (ops/attention_route.h), as
  // the replay of the stage's strategy saw them: "forward causal 65536x65536 32/4x64: cudnn
  // causal graph".
  std::vector<std::string> attention_routes;
};

// The plan of `cfg` on `target` (world = target.world()). Throws InputError when the config
// does not describe a valid run on that world (e.g. parallel.sequence.size not dividing it).
// When it does not fit, knobs lists the single changes that would (searched by re-planning).
MemoryPlan plan_memory(const StageConfig& cfg, const PlanTarget& target);
// The hook for the trainer: plan_memory on run_target(cfg, world_size, ranks_per_node).
MemoryPlan plan_for_run(const StageConfig& cfg, int world_size, int ranks_per_node);

// parallel.zero.offload_optimizer auto on several ranks: each rank's plan chose a placement
// ("host"; "host K" or "host K J": the state of the head and the last K layers in host memory,
// the rest on the GPU, with J layer inputs in host memory to make room; or "gpu J": the GPU with
// J layer inputs in host memory); all ranks take one, since the stores' collectives differ with
// it: host memory when any rank's plan needs it (a node whose GPUs have less memory than the
// others'), else the split with the most layers and inputs in host memory any rank's plan
// needs, else the GPU with the most layer inputs any rank's plan moved out. Throws Error on a
// report that is none of these.
std::string placement_of(const MemoryPlan& p);
std::string agree_placement(const std::vector<std::string>& reports);
// The layer inputs a placement moves to host memory (J of "host K J" and "gpu J", else 0).
int64_t placement_offload_layers(const std::string& placement);
// The layers whose optimizer state a split placement keeps in host memory ("host K [J]": K; 0
// for "host" and "gpu J").
int64_t placement_optimizer_layers(const std::string& placement);
// Writes a placement into `cfg` (what the trainer runs): offload_optimizer resolved (auto off),
// for "host K [J]" offload_optimizer_layers K, and for J > 0 activation.offload cpu with
// activation.offload_layers J. Planned again, the config gives the plan that chose the
// placement.
void apply_placement(StageConfig& cfg, const std::string& placement);

// activation.checkpoint auto: every rank's plan chose (MemoryPlan::auto_checkpoint); all ranks
// take one (a ring's attention recompute is collective): the common choice, `layer` (which every
// rank's plan fits, its choice having fit more) when they differ. Throws Error on a bad report.
std::string agree_checkpoint(const std::vector<std::string>& reports);
// Writes a choice into `cfg`: checkpoint resolved (auto off), attention_output_layers M and,
// for K >= 0, activation.offload cpu with offload_layers K.
void apply_checkpoint(StageConfig& cfg, const std::string& choice);

// ---- Evaluation (forward only: lib/eval/session.h, `easyctx_eval_* --plan`)
// The model comes from its own folder (not the stage config); cfg carries what shapes the
// run: parallel.sequence.* (mode, size, ulysses_size), activation.mlp_tile, lm_head_tile and
// attention_head_groups, data.seq_length = the longest sequence evaluated.
struct InferencePlanInput {
  model::LlamaConfig model;
  StageConfig cfg;
  int64_t load_staging_elems = 0;  // the host f32 buffer the weights pass through (eval::load_staging_elems)
};
// Weights (bf16 on CUDA, f32 on the CPU) and their loading ("init"), the forward-only
// workspace (LlamaModel::score_workspace_specs) and the batch ("step"), the strategy's forward
// buffers (replayed, head groups included) and the LM-head scoring scratch. When it does not
// fit, knobs lists the single changes of activation.attention_head_groups,
// activation.mlp_tile, activation.lm_head_tile or parallel.sequence.size that would.
MemoryPlan plan_inference(const InferencePlanInput& in, const PlanTarget& target);

std::string format_plan_table(const MemoryPlan& p);
// The plan as one JSON object: the one form of it (`--plan`'s last line, <output.dir>/plan.json
// of a run, what easyctx_report reads): fits, target, run, settings, gpu and host totals with
// their peaks broken down by category (`by_category`: "context", "model state" (persistent
// from the set-up), "activations" (persistent from the first step), "transient" (the peak
// phase's own buffers)), items, phases, attention routes, knobs (when it does not fit), notes.
Json plan_to_json(const MemoryPlan& p);
// "does not fit: predicted ... > ... Would fit: --set k=v (X GiB); ..." ("" when it fits).
std::string refusal_message(const MemoryPlan& p);
// After a run: "memory: predicted peak X GiB per GPU (allocations), measured Y GiB (+d%); ...
// host predicted A GiB on rank 0, measured B GiB (VmHWM, +d%)" (the host before the HF export,
// which comes after the line). host_hwm_bytes (vm_hwm_bytes())
// and device_used_bytes (the cudaMemGetInfo high-water mark, compared with the device total)
// are left out when < 0.
std::string compare_line(const MemoryPlan& p, const ops::MemoryStats& measured, double host_hwm_bytes,
                         double device_used_bytes = -1);

}  // namespace easyctx::plan
