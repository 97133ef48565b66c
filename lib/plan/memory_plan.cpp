// The memory plan of a run (plan_memory's core, plan_core) and of an evaluation
// (plan_inference): the run resolved from the config and the target, its buffers walked
// (plan_items.h), and every phase's totals, peaks and what they fit in.
#include "plan/memory_plan.h"

#include <algorithm>
#include <filesystem>

#include "attention/strategy.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/strings.h"
#include "model/llama.h"
#include "ops/scratch.h"
#include "plan/plan_items.h"

namespace easyctx::plan {

const char* to_string(Ranks r) {
  switch (r) {
    case Ranks::Every: return "every rank";
    case Ranks::Root: return "rank 0";
    case Ranks::Others: return "ranks but 0";
  }
  return "?";
}

namespace {

using detail::add_recorded;
using detail::attention_items;
using detail::Group;
using detail::group_specs;
using detail::Items;
using detail::op_scratch_items;
using detail::parameter_items;
using detail::process_and_backend_items;
using detail::process_items;
using detail::reduction_items;
using detail::Run;
using detail::save_items;
using detail::step_items;
using detail::workspace_formula;
using detail::workspace_label;
using ops::DType;

Run run_of(const StageConfig& cfg, const PlanTarget& t, const model::LlamaConfig* mc = nullptr) {
  EASYCTX_CHECK(t.backend != DeviceKind::Auto, "plan_memory: the target's backend must be resolved (cpu or cuda)");
  validate_activation(cfg);
  Run r = mc ? Run(cfg, *mc) : Run(cfg);
  r.cuda = t.backend == DeviceKind::Cuda;
  r.sm90 = r.cuda && cfg.train.hopper_attention && is_hopper_gpu(t.gpu_name);
  r.dtype = r.cuda ? DType::BF16 : DType::F32;
  r.elem_bytes = r.cuda ? 2 : 4;
  r.dev = r.cuda ? "gpu" : "host";
  r.params = r.layout.total_numel();
  r.trained = r.layout.trainable_numel();
  try {
    r.groups = dist::make_group_layout(cfg, t.world(), t.gpus_per_node);
  } catch (const InputError& e) {
    EASYCTX_THROW_INPUT("target world ", t.nodes, " node(s) x ", t.gpus_per_node, " = ", t.world(),
                        " rank(s) (target.nodes x target.gpus_per_node, or the launch): ", e.what());
  }
  r.zero_group =
      r.zero3() ? (cfg.parallel.zero.group == ZeroGroupScope::Node ? r.groups.ranks_per_node : t.world()) : 1;
  r.batch = cfg.train.batch_size;
  r.seq = attention::sequence_split(r.groups).local_length(cfg.data.seq_length);
  r.tokens = checked_mul(r.batch, r.seq, "the plan: tokens per micro-batch, train.batch_size x local sequence length");
  // (The strategies check their shapes when the plan replays them; this one is the config's.)
  const int64_t G = cfg.activation.attention_head_groups;
  EASYCTX_CHECK_INPUT(r.mc.num_kv_heads % G == 0, "activation.attention_head_groups: ", G,
                      " does not divide the model's key/value heads (", r.mc.num_kv_heads, ")");
  return r;
}

// The keys that shape a plan, with their values (MemoryPlan::settings).
Json settings_of(const StageConfig& c) {
  Json s = Json::object();
  s.set("model.config", c.model.config);
  s.set("model.init", c.model.init);
  s.set("model.rope_theta", c.model.rope_theta);
  s.set("data.seq_length", c.data.seq_length);
  s.set("data.document_mask", c.data.document_mask);
  s.set("train.device", to_string(c.train.device));
  s.set("train.batch_size", c.train.batch_size);
  s.set("train.grad_accum", c.train.grad_accum);
  s.set("train.deterministic", c.train.deterministic);
  s.set("train.hopper_attention", c.train.hopper_attention);
  s.set("parallel.sequence.mode", to_string(c.parallel.sequence.mode));
  s.set("parallel.sequence.size", c.parallel.sequence.size);
  s.set("parallel.zero.stage", c.parallel.zero.stage);
  s.set("parallel.zero.group", to_string(c.parallel.zero.group));
  s.set("parallel.zero.prefetch", c.parallel.zero.prefetch);
  s.set("parallel.zero.offload_optimizer", c.parallel.zero.offload_optimizer);
  s.set("parallel.zero.offload_optimizer_layers", c.parallel.zero.offload_optimizer_layers);
  s.set("parallel.zero.offload_params", c.parallel.zero.offload_params);
  s.set("parallel.zero.offload_grads", c.parallel.zero.offload_grads);
  s.set("activation.checkpoint", to_string(c.activation.checkpoint));
  s.set("activation.offload", to_string(c.activation.offload));
  s.set("activation.offload_layers", c.activation.offload_layers);
  s.set("activation.attention_output_layers", c.activation.attention_output_layers);
  s.set("activation.mlp_tile", c.activation.mlp_tile);
  s.set("activation.attention_head_groups", c.activation.attention_head_groups);
  s.set("activation.lm_head_tile", c.activation.lm_head_tile);
  s.set("output.export_hf", c.output.export_hf);
  s.set("lora.rank", c.lora.rank);
  if (c.lora.rank > 0) {
    s.set("lora.targets", c.lora.targets);
    s.set("lora.trainable", c.lora.trainable);
  }
  return s;
}

// What LoRA saves against a full fine-tune of the same model: the frozen parameters' master
// weights, gradients and Adam moments (and, on CUDA, what bf16 costs beside them).
std::string lora_note(const Run& r) {
  const double frozen = static_cast<double>(r.layout.frozen_numel()), e = r.cuda ? 2 : 4;
  const double full = frozen * (r.cuda ? 18 : 16), zero = r.zero3() ? static_cast<double>(r.zero_group) : 1.0;
  return "lora: " + r.layout.lora().describe() + "; the " + format_count(frozen) + " frozen parameters take " +
         format_bytes(e * frozen / zero) + " per rank (" + (r.cuda ? "bf16" : "f32") +
         ", no master weights, gradients or Adam moments: a full fine-tune holds " + format_bytes(full / zero) +
         " for them" + (r.zero3() ? " per rank" : "") + "); " + format_count(static_cast<double>(r.trained)) +
         " trainable parameters keep fp32 master weights, gradients and Adam moments";
}

// Every phase's totals: the persistent items of its time (init's, or all from the first step
// on) plus its own transient ones; the peaks over phases and what they fit in.
MemoryPlan totals(const Run& r, const PlanTarget& t, const Items& it, std::vector<std::string> routes) {
  MemoryPlan p;
  p.settings = settings_of(r.cfg);
  if (!r.note.empty()) p.notes.push_back(r.note);
  p.attention_routes = std::move(routes);
  p.target = t;
  p.model_name = r.mc.name;
  p.parameters = r.params;
  p.trainable_parameters = r.trained;
  if (r.layout.lora().enabled()) p.notes.push_back(lora_note(r));
  p.world = t.world();
  p.dp = r.groups.dp_size;
  p.sp = r.groups.sp_size;
  p.zero_group = static_cast<int>(r.zero_group);
  p.local_len = r.seq;
  p.tokens = r.tokens;
  p.items = it.list;
  const int64_t rpn = t.gpus_per_node;
  for (const std::string& ph : it.phase_order) {
    PhaseTotal pt{ph == "step" ? "steady (between ops)" : ph, 0, 0, 0, 0, 0};
    for (const PlanItem& i : p.items) {
      const bool live = i.transient ? i.phase == ph : (ph != "init" || i.phase == "init");
      if (!live) continue;
      const std::string what = "the plan: " + ph;
      if (i.where == "host") {
        if (i.ranks != Ranks::Others) pt.host_bytes = checked_add(pt.host_bytes, i.bytes, what);
        if (i.ranks != Ranks::Root) pt.host_other_bytes = checked_add(pt.host_other_bytes, i.bytes, what);
      }
      if (i.ranks == Ranks::Others) continue;  // (device items: every rank)
      if (i.tracked && i.where == r.dev) pt.alloc_bytes = checked_add(pt.alloc_bytes, i.bytes, what);
      if (i.where == "gpu") pt.gpu_bytes = checked_add(pt.gpu_bytes, i.bytes, what);
    }
    // Rank 0's node, and a node of other ranks when there is one.
    const int64_t others = checked_mul(rpn - 1, pt.host_other_bytes, "the plan: host memory per node");
    pt.host_node_bytes = checked_add(pt.host_bytes, others, "the plan: host memory per node");
    if (t.nodes > 1)
      pt.host_node_bytes =
          std::max(pt.host_node_bytes, checked_mul(rpn, pt.host_other_bytes, "the plan: host memory per node"));
    p.phases.push_back(pt);
  }
  for (const PhaseTotal& pt : p.phases) {
    if (pt.alloc_bytes > p.alloc_peak_bytes) p.alloc_peak_bytes = pt.alloc_bytes, p.alloc_peak_phase = pt.name;
    if (pt.gpu_bytes > p.gpu_peak_bytes) p.gpu_peak_bytes = pt.gpu_bytes, p.gpu_peak_phase = pt.name;
    const int64_t rank = t.world() > 1 ? std::max(pt.host_bytes, pt.host_other_bytes) : pt.host_bytes;
    if (rank > p.host_rank_peak_bytes) p.host_rank_peak_bytes = rank, p.host_rank_peak_phase = pt.name;
    if (pt.host_node_bytes > p.host_peak_bytes) p.host_peak_bytes = pt.host_node_bytes, p.host_peak_phase = pt.name;
  }
  p.context_bytes = r.cuda ? kCudaContextBytes : 0;
  p.host_peak_bytes = checked_add(p.host_peak_bytes, p.host_shared_bytes, "the plan: host memory per node");
  p.gpu_capacity = r.cuda ? t.gpu_memory_bytes : 0;
  p.gpu_usable = static_cast<int64_t>(static_cast<double>(p.gpu_capacity) * (1.0 - t.headroom));
  p.host_capacity = t.host_memory_bytes;
  p.host_usable = static_cast<int64_t>(static_cast<double>(p.host_capacity) * (1.0 - t.headroom));
  p.gpu_fits = !r.cuda || p.gpu_peak_bytes <= p.gpu_usable;
  p.host_fits = p.host_peak_bytes <= p.host_usable;
  p.fits = p.gpu_fits && p.host_fits;
  p.offload_optimizer = r.offload_opt();
  p.offload_optimizer_layers = r.split_opt() ? r.cfg.parallel.zero.offload_optimizer_layers : 0;
  return p;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Evaluation: forward only.
// ---------------------------------------------------------------------------------------
namespace {
MemoryPlan plan_inference_core(const InferencePlanInput& in, const PlanTarget& t) {
  StageConfig cfg = in.cfg;
  cfg.train.batch_size = 1;
  cfg.parallel.zero.stage = 0;
  cfg.activation.checkpoint = CheckpointPolicy::None;
  cfg.activation.offload = OffloadTarget::None;
  cfg.activation.offload_layers = 0;
  Run r = run_of(cfg, t, &in.model);
  Items it;
  process_and_backend_items(r, t, it);  // the CUDA context, the backend's own buffers, the host baseline
  // The model (its RoPE table) and its weights, one buffer per unit, replayed.
  {
    AllocRecorder dev;
    RecordingOptions ro;
    ro.space = r.cuda ? MemSpace::Device : MemSpace::Host;
    const std::unique_ptr<ops::Backend> be = make_recording_backend(dev, ro);
    const model::LlamaModel model(r.mc, *be, r.dtype, model::options_for(cfg, false));
    std::vector<ops::Buffer> units;
    for (const model::ParamUnit& u : r.layout.units()) units.push_back(be->alloc(r.dtype, u.numel, "weights"));
    std::vector<AllocRecorder::Entry> live = dev.live();
    for (AllocRecorder::Entry& e : live)
      if (e.what == "weights") e.what = std::string("weights (") + (r.cuda ? "bf16" : "f32") + ", every unit)";
    add_recorded(it, false, "init", live, r.dev, true, "eval/model_source.cpp, model/llama.cpp");
  }
  // Loading: one host f32 buffer; on CUDA Backend::copy stages it on the device to convert.
  const int64_t stage = 4 * in.load_staging_elems;
  it.transient("init", "host f32 staging of one tensor or chunk (heap)", "host", stage,
               "4 x largest HF tensor, or 4 x min(unit, 2^26) for a checkpoint", false);
  if (r.cuda)
    it.transient("init", "device f32 staging of the conversion to bf16", "gpu", stage,
                 "4 x the same elements (Backend::copy)");
  // From the first item on: the batch and the forward workspace (kept, sized for the longest).
  const int64_t n = r.tokens, L = cfg.data.seq_length;
  if (r.cuda) it.persistent("step", "batch on the device (tokens, positions, labels)", "gpu", 3 * 4 * n, "3 x 4 x n");
  else it.persistent("step", "batch (tokens, positions, labels)", "host", 3 * 4 * n, "3 x 4 x n");
  it.persistent("step", "host: slice, per-row NLL and argmax, scored-position map", "host", 3 * 4 * n + 12 * n + 12 * L,
                "3 x 4 x n + 12 n + 12 L (L: the whole sequence)", false);
  const model::ModelOptions mo = model::options_for(cfg, false);
  for (const Group& g : group_specs(model::LlamaModel::score_workspace_specs(r.mc, mo, r.dtype, r.batch, r.seq))) {
    const int64_t each = g.numel * static_cast<int64_t>(ops::element_size(g.dtype));
    it.persistent("step", workspace_label(g), r.dev, g.count * each, workspace_formula(g));
  }
  std::vector<std::string> routes;
  attention_items(r, false, it, routes, false);
  const int64_t V = r.mc.vocab_size, tile = cfg.activation.lm_head_tile;
  const std::vector<ops::ScratchBuffer> head =
      r.cuda ? ops::cuda_lm_head_score_scratch(n, V, tile).list() : ops::cpu_lm_head_scratch(n, V, tile, 4).list();
  for (const ops::ScratchBuffer& b : head) {
    if (!r.cuda && b.name.find("NLL") != std::string::npos) continue;  // lm_head_score writes the caller's arrays
    it.transient("LM-head scoring", b.name, r.dev, b.bytes, b.formula, r.cuda);
  }
  return totals(r, t, it, std::move(routes));
}
}  // namespace

namespace detail {

model::LlamaConfig plan_model(const ModelConfig& m, std::string* note) {
  if (starts_with(m.init, "hf:") && !std::filesystem::is_directory(m.init.substr(3)) &&
      m.config != ModelConfig{}.config) {
    ModelConfig shape = m;
    shape.init = "random";
    const model::LlamaConfig c = model::resolve_llama_config(shape);
    if (note)
      *note = "model.init " + m.init + " is not here: planned with model.config " + m.config +
              " (the run needs the folder, and checks that its config.json describes the same model)";
    return c;
  }
  return model::resolve_llama_config(m);
}

// The persistent set ("init" from the set-up, "step" from the first step) and the transient
// buffers of each phase, every one from the code that allocates it (replayed) or from the
// functions that size it.
MemoryPlan plan_core(const StageConfig& cfg, const PlanTarget& t) {
  const Run r = run_of(cfg, t);
  Items it;
  process_items(r, t, it);
  parameter_items(r, t, it);
  step_items(r, it);
  std::vector<std::string> routes;
  attention_items(r, false, it, routes, true);
  attention_items(r, true, it, routes, true);
  op_scratch_items(r, it);
  reduction_items(r, t, it);
  save_items(r, t, it);
  return totals(r, t, it, std::move(routes));
}

}  // namespace detail

MemoryPlan plan_inference(const InferencePlanInput& in, const PlanTarget& target) {
  MemoryPlan p = plan_inference_core(in, target);
  if (p.fits) return p;
  // The knobs of an evaluation, each alone, least drastic first.
  const StageConfig& cfg = in.cfg;
  auto try_one = [&](const std::string& key, int64_t value, const std::string& note, const PlanTarget& t) {
    InferencePlanInput c = in;
    apply_override(c.cfg, key + "=" + std::to_string(value));
    try {
      const MemoryPlan q = plan_inference_core(c, t);
      if (!q.fits) return false;
      p.knobs.push_back({key + "=" + std::to_string(value), note,
                         q.target.backend == DeviceKind::Cuda ? q.gpu_peak_bytes : 0, q.host_peak_bytes, t.nodes,
                         t.gpus_per_node});
      return true;
    } catch (const InputError&) { return false; }
  };
  for (int64_t g = cfg.activation.attention_head_groups + 1; g <= in.model.num_kv_heads; ++g)
    if (in.model.num_kv_heads % g == 0 && try_one("activation.attention_head_groups", g, "", target)) break;
  const int64_t cur_mlp = cfg.activation.mlp_tile > 0 ? cfg.activation.mlp_tile : p.tokens;
  for (int64_t tile = int64_t{1} << 40; tile >= 256; tile /= 2)
    if (tile < cur_mlp && try_one("activation.mlp_tile", tile, "", target)) break;
  for (int64_t tile = cfg.activation.lm_head_tile / 2; tile >= 64; tile /= 2)
    if (try_one("activation.lm_head_tile", tile, "", target)) break;
  for (int64_t sp = cfg.parallel.sequence.size * 2; sp <= 1024; sp *= 2) {
    PlanTarget t = target;
    if (t.world() % sp != 0) {
      t.gpus_per_node = static_cast<int>(std::min<int64_t>(sp, std::max(t.gpus_per_node, 8)));
      t.nodes = static_cast<int>((sp + t.gpus_per_node - 1) / t.gpus_per_node);
    }
    const std::string unit = t.backend == DeviceKind::Cuda ? " GPUs" : " ranks";
    if (try_one("parallel.sequence.size", sp, "needs " + std::to_string(t.world()) + unit, t)) break;
  }
  return p;
}

MemoryPlan plan_for_run(const StageConfig& cfg, int world_size, int ranks_per_node) {
  return plan_memory(cfg, run_target(cfg, world_size, ranks_per_node));
}

}  // namespace easyctx::plan
