// Internal to lib/plan: the run a plan is for (Run) and its buffers (Items), and the walk
// over what a run allocates, phase by phase: the replays on recording backends
// (plan_replay.cpp) and the items sized by the functions that size them (plan_items.cpp).
// memory_plan.cpp sums them into a MemoryPlan. Included by those files only.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "dist/groups.h"
#include "model/llama.h"
#include "model/param_layout.h"
#include "plan/memory_plan.h"
#include "plan/plan_detail.h"
#include "plan/recorder.h"
#include "zero/shard_layout.h"

namespace easyctx::plan::detail {

using ops::DType;

inline std::string num(int64_t v) { return std::to_string(v); }

// ---------------------------------------------------------------------------------------
// The run being planned: model, shapes, layout.
// ---------------------------------------------------------------------------------------
struct Run {
  const StageConfig& cfg;
  std::string note;  // how the model was resolved, when the reader should know (plan_model)
  model::LlamaConfig mc;
  model::ParamLayout layout;
  dist::GroupLayout groups;
  bool cuda = false;
  bool sm90 = false;         // the attention's Hopper routes (train.hopper_attention on an sm_90 target)
  DType dtype = DType::F32;  // activations and working parameters
  int64_t elem_bytes = 4;    // bytes per activation element
  int64_t params = 0;        // parameters
  int64_t trained = 0;       // of them, those that train (LoRA: the adapters and the trainable copies)
  int64_t batch = 1;         // sequences per micro-batch
  int64_t seq = 0;           // local tokens per sequence (this rank's part of the sequence)
  int64_t tokens = 0;        // batch x seq
  int64_t zero_group = 1;    // ZeRO-3 shard group size (1: no sharding)
  std::string dev;           // where the backend allocates: "gpu" (CUDA) or "host" (CPU)

  explicit Run(const StageConfig& c)
      : cfg(c), mc(detail::plan_model(c.model, &note)), layout(mc, model::lora_spec(c.lora)) {}
  Run(const StageConfig& c, const model::LlamaConfig& m) : cfg(c), mc(m), layout(mc, model::lora_spec(c.lora)) {}
  bool zero3() const { return cfg.parallel.zero.stage == 3; }
  bool offload_opt() const { return cfg.parallel.zero.offload_optimizer && cuda; }
  // offload_optimizer_layers: some units' state on the device (the store's own rule).
  bool split_opt() const {
    const int64_t k = cfg.parallel.zero.offload_optimizer_layers;
    return offload_opt() && !zero3() && k > 0 && k < mc.num_layers;
  }
  // ZeRO-3's cut of the units over zero_group ranks (every rank's shards have the same lengths).
  zero::ShardLayout shards() const { return zero::ShardLayout(layout, static_cast<int>(zero_group), 0); }
};

// ---------------------------------------------------------------------------------------
// Items.
// ---------------------------------------------------------------------------------------
class Items {
 public:
  std::vector<PlanItem> list;
  std::vector<std::string> phase_order{"init", "step"};

  void persistent(const std::string& when, const std::string& name, const std::string& where, int64_t bytes,
                  const std::string& formula, bool tracked = true) {
    if (bytes > 0) list.push_back({name, where, bytes, formula, false, when, tracked});
  }
  void transient(const std::string& phase, const std::string& name, const std::string& where, int64_t bytes,
                 const std::string& formula, bool tracked = true, Ranks ranks = Ranks::Every) {
    if (bytes <= 0) return;
    if (std::find(phase_order.begin(), phase_order.end(), phase) == phase_order.end()) phase_order.push_back(phase);
    list.push_back({name, where, bytes, formula, true, phase, tracked, ranks});
  }
};

// ---------------------------------------------------------------------------------------
// The model's workspace, grouped for the table ("acts.3.h1" -> "acts.*.h1").
// ---------------------------------------------------------------------------------------
struct Group {
  std::string key;
  DType dtype;
  int64_t numel = 0;  // per buffer
  int64_t count = 0;
  bool pinned_host = false;  // offloaded checkpoints (BufferSpec::pinned_host)
  std::string shape, label;  // BufferSpec's, from where the model allocates the buffer
};

// Same-label buffers as one item: "label" with the bytes summed and their count (plan_replay.cpp).
void add_recorded(Items& it, bool transient, const std::string& phase, const std::vector<AllocRecorder::Entry>& entries,
                  const std::string& where, bool tracked, const std::string& source);
// The attention phase's transient items, forward or backward (plan_replay.cpp).
void attention_items(const Run& r, bool backward, Items& it, std::vector<std::string>& routes, bool tiled);
// The model and the parameter store, replayed: the "init" items (plan_replay.cpp).
void parameter_items(const Run& r, const PlanTarget& t, Items& it);

// The workspace groups (plan_items.cpp).
std::vector<Group> group_specs(const std::vector<model::BufferSpec>& specs);
std::string workspace_label(const Group& g);
std::string workspace_formula(const Group& g);
// The phases' items sized by the functions that size them (plan_items.cpp).
void process_and_backend_items(const Run& r, const PlanTarget& t, Items& it);
void process_items(const Run& r, const PlanTarget& t, Items& it);
void step_items(const Run& r, Items& it);
void op_scratch_items(const Run& r, Items& it);
void reduction_items(const Run& r, const PlanTarget& t, Items& it);
void save_items(const Run& r, const PlanTarget& t, Items& it);

}  // namespace easyctx::plan::detail
