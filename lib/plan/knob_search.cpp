// The knob search behind a refusal: which single config change (or, failing that, which
// combination of the changes that keep the problem) makes a plan fit.
#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/strings.h"
#include "model/llama_config.h"
#include "plan/memory_plan.h"
#include "plan/plan_detail.h"

namespace easyctx::plan {
namespace detail {
namespace {

std::string num(int64_t v) { return std::to_string(v); }
std::string plural(int64_t v, const std::string& what) { return num(v) + " " + what + (v == 1 ? "" : "s"); }

// ---------------------------------------------------------------------------------------
// Knob search: each knob re-plans with one change and reports its least drastic value that
// fits; when no knob that keeps the problem (sequence length, batch, GPU count) fits alone,
// a greedy combination of those is searched too.
// ---------------------------------------------------------------------------------------
struct Candidate {
  std::string assignment, note;  // assignment: "key=value" (several separated by spaces)
  StageConfig cfg;
  PlanTarget target;
};

struct Family {
  std::string key;
  bool keeps_problem = true;           // false: changes what is trained or needs more GPUs
  std::vector<Candidate> values;       // least drastic first
  std::vector<std::string> also = {};  // other keys its values may set (reset and reported with it)
};

// What of the model the families range over, resolved once per search; a model that does not
// resolve has neither (its plan fails anyway).
struct ModelShape {
  int64_t layers = 0, kv_heads = 0;
};
ModelShape model_shape(const StageConfig& cfg) {
  try {
    const model::LlamaConfig mc = plan_model(cfg.model, nullptr);
    return {mc.num_layers, mc.num_kv_heads};
  } catch (const Error&) { return {}; }
}

// Makes a family's candidates: each the searched config and target with one change.
struct KnobMaker {
  const StageConfig& cfg;
  const PlanTarget& t;
  bool cuda;
  Candidate one(const std::string& key, const std::string& value, const std::string& note = "") const {
    Candidate c{key + "=" + value, note, cfg, t};
    apply_override(c.cfg, key + "=" + value);
    return c;
  }
};

// The recomputation knobs, with the optimizer offload (as cheap) among them: activation.checkpoint,
// parallel.zero.offload_optimizer, activation.mlp_tile, activation.attention_output_layers.
void add_checkpoint_families(const KnobMaker& kn, int64_t n, const ModelShape& m, std::vector<Family>& fams) {
  const StageConfig& cfg = kn.cfg;
  const bool cuda = kn.cuda;
  // activation.checkpoint: layer keeps the least
  if (cfg.activation.checkpoint != CheckpointPolicy::Layer)
    fams.push_back({"activation.checkpoint", true, {kn.one("activation.checkpoint", "layer")}});
  if (cuda && !cfg.parallel.zero.offload_optimizer)
    fams.push_back({"parallel.zero.offload_optimizer", true, {kn.one("parallel.zero.offload_optimizer", "true")}});
  if (cuda && cfg.parallel.zero.offload_optimizer && cfg.parallel.zero.offload_optimizer_layers > 0)  // (a split)
    fams.push_back({"parallel.zero.offload_optimizer_layers",
                    true,
                    {kn.one("parallel.zero.offload_optimizer_layers", "0", "every unit's state in host memory")}});
  // activation.mlp_tile: powers of two below n, largest first (checkpointed runs only)
  if (cfg.activation.checkpoint != CheckpointPolicy::None) {
    Family f{"activation.mlp_tile", true, {}};
    const int64_t cur = cfg.activation.mlp_tile > 0 ? cfg.activation.mlp_tile : n;
    for (int64_t tile = int64_t{1} << 40; tile >= 256; tile /= 2)
      if (tile < cur) f.values.push_back(kn.one("activation.mlp_tile", num(tile)));
    fams.push_back(f);
  }
  const int64_t layers = m.layers;
  // activation.attention_output_layers: fewer layers keep their attention output, the most first
  if (cfg.activation.checkpoint == CheckpointPolicy::AttentionOutput && layers > 1) {
    Family f{"activation.attention_output_layers", true, {}};
    const int64_t kept = cfg.activation.attention_output_layers;
    for (int64_t k = (kept <= 0 || kept > layers) ? layers - 1 : kept - 1; k >= 1; --k)
      f.values.push_back(kn.one("activation.attention_output_layers", num(k)));
    if (!f.values.empty()) fams.push_back(f);
  }
}

void add_activation_offload_family(const KnobMaker& kn, const ModelShape& m, std::vector<Family>& fams) {
  const StageConfig& cfg = kn.cfg;
  const bool cuda = kn.cuda;
  const int64_t layers = m.layers;
  // activation.offload: the checkpoints to pinned host memory (GPUs: on the CPU backend they
  // are in host memory already), the fewest layers first (least host memory and traffic);
  // offloaded already but not all: more layers.
  const bool offload_all = cfg.activation.offload_layers == 0 || cfg.activation.offload_layers >= layers - 1;
  if (cuda && cfg.activation.checkpoint != CheckpointPolicy::None && layers > 1 &&
      (cfg.activation.offload == OffloadTarget::None || !offload_all)) {
    Family f{"activation.offload", true, {}, {"activation.offload_layers"}};
    const int64_t from = cfg.activation.offload == OffloadTarget::Cpu ? cfg.activation.offload_layers + 1 : 1;
    for (int64_t k = from; k <= layers - 1; ++k) {
      Candidate c = kn.one("activation.offload", "cpu");
      const std::string kl = k == layers - 1 ? "0" : num(k);
      apply_override(c.cfg, "activation.offload_layers=" + kl);
      if (kl != "0") c.assignment += " activation.offload_layers=" + kl;
      f.values.push_back(c);
    }
    fams.push_back(f);
  }
}

void add_tile_families(const KnobMaker& kn, const ModelShape& m, std::vector<Family>& fams) {
  const StageConfig& cfg = kn.cfg;
  const int64_t kv_heads = m.kv_heads;
  // activation.attention_head_groups: divisors of the key/value heads above the current one.
  {
    Family f{"activation.attention_head_groups", true, {}};
    for (int64_t g = cfg.activation.attention_head_groups + 1; g <= kv_heads; ++g)
      if (kv_heads % g == 0) f.values.push_back(kn.one("activation.attention_head_groups", num(g)));
    if (!f.values.empty()) fams.push_back(f);
  }
  {
    Family f{"activation.lm_head_tile", true, {}};
    for (int64_t tile = cfg.activation.lm_head_tile / 2; tile >= 64; tile /= 2)
      f.values.push_back(kn.one("activation.lm_head_tile", num(tile)));
    fams.push_back(f);
  }
}

void add_sequence_parallel_family(const KnobMaker& kn, std::vector<Family>& fams) {
  const StageConfig& cfg = kn.cfg;
  const PlanTarget& t = kn.t;
  const std::string unit = kn.cuda ? " GPUs" : " ranks";
  // parallel.sequence.size: doubling; on the same ranks while it divides the world, else on
  // more (filling a node up to 8 GPUs first, then adding nodes).
  {
    Family f{"parallel.sequence.size", false, {}, {"parallel.sequence.mode"}};
    const int dp = t.world() / static_cast<int>(std::max<int64_t>(1, cfg.parallel.sequence.size));
    for (int64_t sp = cfg.parallel.sequence.size * 2; sp <= 4096; sp *= 2) {
      Candidate c = kn.one("parallel.sequence.size", num(sp));
      if (cfg.parallel.sequence.mode == SeqParallelMode::None) {
        apply_override(c.cfg, "parallel.sequence.mode=zigzag_ring");
        c.assignment += " parallel.sequence.mode=zigzag_ring";
      }
      if (t.world() % sp == 0) {
        c.note = "same" + unit + ", data-parallel " + num(t.world() / sp);
      } else {
        const int64_t world = std::max(1, dp) * sp;
        if (t.nodes == 1 && world <= std::max(8, t.gpus_per_node)) {
          c.target.gpus_per_node = static_cast<int>(world);
        } else if (world % t.gpus_per_node == 0) {
          c.target.nodes = static_cast<int>(world / t.gpus_per_node);
        } else {
          continue;
        }
        c.note = "needs " + num(world) + unit + ": target.nodes=" + num(c.target.nodes) +
                 ", target.gpus_per_node=" + num(c.target.gpus_per_node);
      }
      f.values.push_back(c);
    }
    fams.push_back(f);
  }
}

// Shorter sequences and smaller batches: they fit by training something else.
void add_problem_families(const KnobMaker& kn, std::vector<Family>& fams) {
  const StageConfig& cfg = kn.cfg;
  {
    Family f{"data.seq_length", false, {}};
    for (int64_t len = cfg.data.seq_length / 2; len >= 128; len /= 2)
      f.values.push_back(kn.one("data.seq_length", num(len)));
    fams.push_back(f);
  }
  {
    Family f{"train.batch_size", false, {}};
    for (int64_t b = cfg.train.batch_size / 2; b >= 1; b /= 2)
      f.values.push_back(kn.one("train.batch_size", num(b), "raise train.grad_accum to keep the global batch"));
    fams.push_back(f);
  }
}

void add_zero_families(const KnobMaker& kn, std::vector<Family>& fams) {
  const StageConfig& cfg = kn.cfg;
  const PlanTarget& t = kn.t;
  const bool cuda = kn.cuda;
  // ZeRO-3: shards the weights and optimizer state over the ranks (gathers per layer); with
  // offload_optimizer the optimizer shards stay in host memory (each rank's host holds 1/Z).
  if (cuda && cfg.parallel.zero.stage == 0 && t.world() > 1) {
    Candidate c = kn.one("parallel.zero.stage", "3");
    c.cfg.parallel.zero.offload_optimizer_layers = 0;  // (a stage-0 split does not carry over)
    fams.push_back({"parallel.zero.stage", true, {c}});
  }
  // ZeRO-3 with the optimizer shards in host memory: the bf16 parameter shards may follow them.
  if (cuda && cfg.parallel.zero.stage == 3 && cfg.parallel.zero.offload_optimizer && !cfg.parallel.zero.offload_params)
    fams.push_back({"parallel.zero.offload_params", true, {kn.one("parallel.zero.offload_params", "true")}});
  // ... and the layers' fp32 gradient shards.
  if (cuda && cfg.parallel.zero.stage == 3 && cfg.parallel.zero.offload_optimizer && !cfg.parallel.zero.offload_grads)
    fams.push_back({"parallel.zero.offload_grads", true, {kn.one("parallel.zero.offload_grads", "true")}});
  // One GPU, the optimizer in host memory already: ZeRO-3 over a group of one shards nothing,
  // but streams the layers through its gather pool, so their gradients and then their bf16
  // weights can live in host memory too; offered with those offloads (stage 3 alone only adds
  // the pool).
  if (cuda && cfg.parallel.zero.stage == 0 && t.world() == 1 && cfg.parallel.zero.offload_optimizer) {
    Family f{"parallel.zero.stage", true, {}, {"parallel.zero.offload_grads", "parallel.zero.offload_params"}};
    Candidate c = kn.one("parallel.zero.stage", "3");
    c.cfg.parallel.zero.offload_optimizer_layers =
        0;  // (a stage-0 split: ZeRO-3 keeps every shard's state in host memory)
    for (const std::string s : {"parallel.zero.offload_grads=true", "parallel.zero.offload_params=true"}) {
      apply_override(c.cfg, s);
      c.assignment += " " + s;
      f.values.push_back(c);
    }
    fams.push_back(f);
  }
}

// The families in the order the search tries them.
std::vector<Family> knob_families(const StageConfig& cfg, const PlanTarget& t, int64_t n, const ModelShape& m) {
  const KnobMaker kn{cfg, t, t.backend == DeviceKind::Cuda};
  std::vector<Family> fams;
  add_checkpoint_families(kn, n, m, fams);
  add_activation_offload_family(kn, m, fams);
  add_tile_families(kn, m, fams);
  add_sequence_parallel_family(kn, fams);
  add_problem_families(kn, fams);
  add_zero_families(kn, fams);
  return fams;
}

// How far a plan is from fitting: its largest peak / usable ratio (<= 1 fits).
double overflow(const MemoryPlan& q) {
  double r = static_cast<double>(q.host_peak_bytes) / static_cast<double>(std::max<int64_t>(1, q.host_usable));
  if (q.target.backend == DeviceKind::Cuda)
    r = std::max(r, static_cast<double>(q.gpu_peak_bytes) / static_cast<double>(std::max<int64_t>(1, q.gpu_usable)));
  return r;
}

bool try_plan(const Candidate& c, MemoryPlan& q) {
  try {
    q = plan_core(c.cfg, c.target);
    return true;
  } catch (const InputError&) {
    return false;  // not a valid run (e.g. heads not divisible by the new size)
  }
}

// Greedy: add the problem-keeping knob (at its most saving value) that brings the plan
// closest to fitting until it fits; then relax each chosen knob to its least drastic value
// that still fits. Empty when nothing fits or one knob is enough (reported on its own).
std::vector<KnobFix> combine_knobs(const StageConfig& cfg, const PlanTarget& t, int64_t n, const ModelShape& m) {
  StageConfig cur = cfg;
  std::vector<Family> chosen;  // the families added (key and also; values unused), in order
  MemoryPlan q = plan_core(cur, t);
  while (!q.fits) {
    double best = overflow(q);
    Candidate pick;
    const Family* picked = nullptr;
    const std::vector<Family> fams = knob_families(cur, t, n, m);
    for (const Family& f : fams) {
      if (!f.keeps_problem || f.values.empty()) continue;
      MemoryPlan r;
      if (try_plan(f.values.back(), r) && overflow(r) < best) best = overflow(r), pick = f.values.back(), picked = &f;
    }
    if (!picked) break;
    cur = pick.cfg;
    chosen.push_back({picked->key, true, {}, picked->also});
    q = plan_core(cur, t);
  }
  if (!q.fits || chosen.size() < 2) return {};
  // Relax: each knob (with the keys it also sets) back to its least drastic value that keeps
  // the whole fitting.
  for (const Family& ch : chosen) {
    StageConfig without = cur;
    apply_override(without, ch.key + "=" + config_value(cfg, ch.key));
    for (const std::string& a : ch.also) apply_override(without, a + "=" + config_value(cfg, a));
    for (const Family& f : knob_families(without, t, n, m)) {
      if (f.key != ch.key) continue;
      for (const Candidate& c : f.values) {
        MemoryPlan r;
        if (try_plan(c, r) && r.fits) {
          cur = c.cfg;
          break;
        }
      }
    }
  }
  q = plan_core(cur, t);
  KnobFix k{"", "together", q.gpu_peak_bytes, q.host_peak_bytes, t.nodes, t.gpus_per_node};
  for (const Family& ch : chosen) {
    k.assignment += (k.assignment.empty() ? "" : " ") + ch.key + "=" + config_value(cur, ch.key);
    for (const std::string& a : ch.also)  // what the knob changed besides its key
      if (config_value(cur, a) != config_value(cfg, a)) k.assignment += " " + a + "=" + config_value(cur, a);
  }
  return {k};
}

}  // namespace

std::vector<KnobFix> search_knobs(const StageConfig& cfg, const PlanTarget& t, int64_t n) {
  const ModelShape m = model_shape(cfg);
  std::vector<KnobFix> out;
  bool kept_problem_fits = false;
  for (const Family& f : knob_families(cfg, t, n, m))
    for (const Candidate& c : f.values) {
      MemoryPlan q;
      if (!try_plan(c, q) || !q.fits) continue;
      out.push_back(
          {c.assignment, c.note, q.gpu_peak_bytes, q.host_peak_bytes, c.target.nodes, c.target.gpus_per_node});
      kept_problem_fits |= f.keeps_problem;
      break;
    }
  if (!kept_problem_fits)
    for (const KnobFix& k : combine_knobs(cfg, t, n, m)) out.push_back(k);
  return out;
}

KeptOutputs most_kept_outputs(const StageConfig& cfg, const PlanTarget& t, bool move_inputs) {
  const int64_t layers = model_shape(cfg).layers;
  if (layers < 1) return {};
  // The most layers that keep their output with `k` layer inputs offloaded (-1: the config's
  // offload as it is); the bytes grow with the layers kept: a bisection.
  const auto most_kept = [&](int64_t k) {
    StageConfig base = cfg;
    base.activation.checkpoint = CheckpointPolicy::AttentionOutput;
    base.activation.checkpoint_auto = false;
    if (k >= 0) {
      base.activation.offload = OffloadTarget::Cpu;
      base.activation.offload_layers = k == layers - 1 ? 0 : k;
    }
    const auto plan_with = [&](int64_t m) {
      StageConfig c = base;
      c.activation.attention_output_layers = m == layers ? 0 : m;
      MemoryPlan q;
      return try_plan({"", "", c, t}, q) && q.fits ? std::optional<MemoryPlan>(std::move(q)) : std::nullopt;
    };
    KeptOutputs b;
    b.offload = k;
    std::optional<MemoryPlan> at = plan_with(1);
    if (!at) return b;
    int64_t lo = 1, hi = layers;
    while (lo < hi) {
      const int64_t mid = hi - (hi - lo) / 2;
      if (std::optional<MemoryPlan> q = plan_with(mid)) {
        lo = mid;
        at = std::move(q);
      } else {
        hi = mid - 1;
      }
    }
    b.kept = lo;
    b.plan = std::move(*at);
    return b;
  };
  // As the run is, then (move_inputs, more than one layer) with more layer inputs in host
  // memory: each frees a layer's input on the GPU for an output. The most layers kept win, then
  // the fewest inputs moved.
  KeptOutputs best = most_kept(-1);
  best.as_is = best.kept;
  if (!move_inputs) return best;
  const bool offloaded = cfg.activation.offload == OffloadTarget::Cpu;
  const int64_t k0 = !offloaded ? 0 : (cfg.activation.offload_layers <= 0 ? layers - 1 : cfg.activation.offload_layers);
  for (int64_t k = k0 + 1; k <= layers - 1 && best.kept < layers; ++k) {
    KeptOutputs b = most_kept(k);
    if (b.kept > best.kept) {
      b.as_is = best.as_is;
      best = std::move(b);
    }
  }
  return best;
}

std::string kept_outputs_text(const StageConfig& cfg, const KeptOutputs& k, bool hint) {
  const int64_t layers = model_shape(cfg).layers;
  const auto what = [&](int64_t kept) {
    return kept == layers ? std::string("attention_output")
                          : "attention_output with activation.attention_output_layers " + num(kept);
  };
  const bool offloaded = cfg.activation.offload == OffloadTarget::Cpu;
  const int64_t k0 = !offloaded ? 0 : (cfg.activation.offload_layers <= 0 ? layers - 1 : cfg.activation.offload_layers);
  std::string s = what(k.kept);
  if (k.offload >= 0)
    s += ", activation.offload cpu, activation.offload_layers " + num(k.offload) + " (" +
         plural(k.offload - (offloaded ? k0 : 0), "more layer input") + " in pinned host memory)";
  s += std::string(hint ? " would fit too" : "") + " (" + gib(k.plan.gpu_peak_bytes) + " of " + gib(k.plan.gpu_usable) +
       " usable per GPU, " + gib(k.plan.host_peak_bytes) + " host per node): " +
       (k.kept == layers ? std::string(hint ? "no layer would recompute" : "no layer recomputes") + " its attention"
        : k.kept == 1
            ? std::string(hint ? "the last layer would skip" : "the last layer skips") + " its attention recompute"
            : "the last " + num(k.kept) + " of " + num(layers) + (hint ? " layers would skip" : " layers skip") +
                  " their attention recompute") +
       " in backward (the same arithmetic)";
  if (k.offload >= 0)
    s += k.as_is > 0 ? "; with the offload as it is, " + what(k.as_is) : "; with the offload as it is, none fits";
  return s;
}

std::string kept_outputs_hint(const StageConfig& cfg, const PlanTarget& t) {
  const KeptOutputs best = most_kept_outputs(cfg, t, true);
  return best.kept == 0 ? "" : "activation.checkpoint layer: " + kept_outputs_text(cfg, best, true);
}

}  // namespace detail

using detail::gib;

std::string KnobFix::to_string() const {
  std::string s;
  for (const std::string& a : split(assignment, ' ')) s += (s.empty() ? "--set " : " --set ") + a;
  s += " (" + (gpu_bytes > 0 ? gib(gpu_bytes) + " per GPU" : gib(host_bytes) + " per node");
  if (!note.empty()) s += ", " + note;
  return s + ")";
}

std::string refusal_message(const MemoryPlan& p) {
  if (p.fits) return "";
  std::ostringstream os;
  os << "does not fit:";
  if (!p.gpu_fits)
    os << " predicted " << gib(p.gpu_peak_bytes) << " per GPU (" << p.gpu_peak_phase << ") > " << gib(p.gpu_usable)
       << " usable of " << gib(p.gpu_capacity) << " (" << p.target.gpu_name << ", headroom "
       << std::lround(100 * p.target.headroom) << "%)" << (p.host_fits ? "." : ";");
  if (!p.host_fits)
    os << " predicted host " << gib(p.host_peak_bytes) << " per node (" << p.target.gpus_per_node << " rank(s), "
       << p.host_peak_phase << ") > " << gib(p.host_usable) << " usable of " << gib(p.host_capacity) << ".";
  if (p.knobs.empty()) {
    // Name the memory that is short: GPU memory, the nodes' host memory, or both.
    const std::string more = !p.gpu_fits && !p.host_fits ? "use GPUs with more memory and nodes with more host memory"
                             : !p.gpu_fits
                                 ? "use GPUs with more memory"
                                 : "use nodes with more host memory (the plan assumed " +
                                       gib(p.target.host_memory_bytes) + " per node, " + p.target.host_source + ")";
    os << " Nothing makes it fit: not activation.checkpoint (nor attention_output_layers), activation.mlp_tile, "
          "activation.offload (and offload_layers), activation.attention_head_groups, activation.lm_head_tile, "
          "parallel.zero.stage, parallel.zero.offload_optimizer, parallel.zero.offload_params, "
          "parallel.zero.offload_grads, "
          "parallel.sequence.size, data.seq_length or train.batch_size alone, nor "
          "those that keep the problem together; "
       << more << ".";
    return os.str();
  }
  os << " Would fit:";
  for (size_t i = 0; i < p.knobs.size(); ++i) os << (i ? "; " : " ") << p.knobs[i].to_string();
  os << ".";
  return os.str();
}

}  // namespace easyctx::plan
