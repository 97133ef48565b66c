#include "plan/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "ckpt/safetensors.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/strings.h"
#include "dist/groups.h"
#include "model/llama.h"
#include "model/param_layout.h"
#include "attention/strategy.h"
#include "plan/plan_detail.h"
#include "ops/scratch.h"
#include "plan/recorder.h"
#include "zero/param_store.h"
#include "zero/shard_layout.h"

namespace easyctx::plan {
using model::BufferSpec;

const char* to_string(Ranks r) {
  switch (r) {
    case Ranks::Every: return "every rank";
    case Ranks::Root: return "rank 0";
    case Ranks::Others: return "ranks but 0";
  }
  return "?";
}

namespace {

using ops::DType;

std::string num(int64_t v) { return std::to_string(v); }

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

// Same-label buffers as one item: "label" with the bytes summed and their count.
void add_recorded(Items& it, bool transient, const std::string& phase, const std::vector<AllocRecorder::Entry>& entries,
                  const std::string& where, bool tracked, const std::string& source) {
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> groups;  // label -> (bytes, count)
  for (const AllocRecorder::Entry& e : entries) {
    auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == e.what; });
    if (g == groups.end()) g = groups.insert(groups.end(), {e.what, {0, 0}});
    g->second.first = checked_add(g->second.first, e.bytes, "the plan: " + e.what);
    g->second.second += 1;
  }
  for (const auto& [what, bc] : groups) {
    const std::string f = num(bc.second) + (bc.second == 1 ? " buffer" : " buffers") + " (replay of " + source + ")";
    if (transient) it.transient(phase, what, where, bc.first, f, tracked);
    else it.persistent(phase, what, where, bc.first, f, tracked);
  }
}

// data.document_mask: documents that cut every block of every strategy (a border inside each
// quarter of this rank's tokens, at odd positions), so the replay allocates what a packed
// window's partial blocks do (the LSE scratch of masked_attention_fwd/bwd); else none.
std::vector<attention::DocumentStarts> plan_documents(const Run& r) {
  if (!r.cfg.data.document_mask) return {};
  const int64_t global = attention::sequence_split(r.groups).padded_length(r.cfg.data.seq_length);
  attention::DocumentStarts starts{0};
  for (int64_t p = std::max<int64_t>(1, r.seq / 4) + 1; p < global; p += std::max<int64_t>(2, r.seq / 4))
    starts.push_back(p);
  return std::vector<attention::DocumentStarts>(static_cast<size_t>(r.batch), starts);
}

// The attention phase's transient items (forward or backward): the stage's strategy
// (attention/strategy.h, head groups included) runs on a recording backend over recording
// communicators of the groups' sizes, on this rank's q, k, v, o, LSE (the model's workspace,
// counted there); what it allocates beyond them, at its peak, with the CUDA backend's
// attention scratch of each block (ops/attention_route.h), is the phase. tiled: the training
// model, which tiles its attention block over activation.attention_head_groups itself and
// calls the inner strategy on one group's heads (LlamaModel::attention_forward_grouped);
// else (forward_score) the strategy in head groups on every head. A model with a sliding window
// replays the attention of its windowed layers and of its full ones (qwen2's per-layer windows)
// and takes the larger phase.
std::vector<AllocRecorder::Entry> replay_attention(const Run& r, bool backward, std::vector<std::string>& routes,
                                                   bool tiled, int64_t window, std::string* name);
void attention_items(const Run& r, bool backward, Items& it, std::vector<std::string>& routes, bool tiled) {
  std::vector<AllocRecorder::Entry> peak;
  int64_t peak_bytes = -1;
  std::string name;
  std::vector<int64_t> windows;  // the layers' windows (0: full attention)
  if (r.mc.windowed_layers() < r.mc.num_layers) windows.push_back(0);
  if (r.mc.windowed_layers() > 0) windows.push_back(r.mc.sliding_window);
  for (const int64_t window : windows) {
    std::vector<AllocRecorder::Entry> e = replay_attention(r, backward, routes, tiled, window, &name);
    int64_t bytes = 0;
    for (const AllocRecorder::Entry& x : e) bytes += x.bytes;
    if (bytes > peak_bytes) peak = std::move(e), peak_bytes = bytes;
  }
  add_recorded(it, true, backward ? "attention backward" : "attention forward", peak, r.dev, true,
               "lib/attention/" + name);
}

// One replay of attention_items: the buffers at the attention phase's peak for layers of this window.
std::vector<AllocRecorder::Entry> replay_attention(const Run& r, bool backward, std::vector<std::string>& routes,
                                                   bool tiled, int64_t window, std::string* name) {
  AllocRecorder inputs, rec;
  RecordingOptions ro;
  ro.space = r.cuda ? MemSpace::Device : MemSpace::Host;
  ro.cuda_scratch = r.cuda;
  ro.deterministic = r.cfg.train.deterministic;
  ro.sm90 = r.sm90;
  ro.routes = &routes;
  const std::unique_ptr<ops::Backend> in = make_recording_backend(inputs, ro), be = make_recording_backend(rec, ro);
  const dist::GroupLayout& g = r.groups;
  const MemSpace cs = r.cuda ? MemSpace::Device : MemSpace::Host;
  const int ring = g.mode == SeqParallelMode::Usp ? g.sp_size / std::max(1, g.ulysses_size) : g.sp_size;
  const auto sp = make_recording_comm("sp", g.sp_size, 0, cs), rg = make_recording_comm("ring", ring, 0, cs);
  const auto ul = make_recording_comm("ulysses", std::max(1, g.ulysses_size), 0, cs);
  const int64_t G = tiled ? r.cfg.activation.attention_head_groups : 1;
  StageConfig cfg = r.cfg;
  if (tiled) cfg.activation.attention_head_groups = 1;
  const std::shared_ptr<attention::SequenceAttention> attn =
      attention::make_sequence_attention(cfg, g, {*sp, *rg, *ul}, *be);
  const int64_t B = r.batch, S = r.seq, hq = r.mc.num_heads / G, hkv = r.mc.num_kv_heads / G, hd = r.mc.head_dim;
  const DType lse_t = DType::F32;
  std::vector<ops::Buffer> bufs;
  auto tensor = [&](DType t, std::initializer_list<int64_t> dims) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    bufs.push_back(in->alloc(t, n));
    return bufs.back().view(dims);
  };
  const std::vector<attention::DocumentStarts> docs = plan_documents(r);
  const attention::AttentionTensors t{tensor(r.dtype, {B, S, hq, hd}),
                                      tensor(r.dtype, {B, S, hkv, hd}),
                                      tensor(r.dtype, {B, S, hkv, hd}),
                                      tensor(r.dtype, {B, S, hq, hd}),
                                      tensor(lse_t, {B, hq, S}),
                                      1.0 / std::sqrt(static_cast<double>(hd)),
                                      docs.empty() ? nullptr : docs.data(),
                                      window};
  rec.begin_phase();
  if (backward) {
    const attention::AttentionGrads gr{tensor(r.dtype, {B, S, hq, hd}), tensor(r.dtype, {B, S, hq, hd}),
                                       tensor(r.dtype, {B, S, hkv, hd}), tensor(r.dtype, {B, S, hkv, hd})};
    attn->backward(t, gr);
  } else {
    attn->forward(t);
  }
  *name = attn->name();
  return rec.peak_extra();
}

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

std::vector<Group> group_specs(const std::vector<BufferSpec>& specs) {
  std::vector<Group> out;
  for (const BufferSpec& s : specs) {
    std::string key;
    for (const std::string& part : split(s.name, '.')) {
      const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
      key += (key.empty() ? "" : ".") + (digits ? std::string("*") : part);
    }
    auto it = std::find_if(out.begin(), out.end(), [&](const Group& g) { return g.key == key && g.numel == s.numel; });
    if (it == out.end()) out.push_back({key, s.dtype, s.numel, 1, s.pinned_host, s.shape, s.label});
    else ++it->count;
  }
  return out;
}

std::string workspace_label(const Group& g) {
  std::string name = "workspace " + g.key + (g.label.empty() ? "" : ": " + g.label);
  if (g.count > 1) name += " x" + num(g.count);
  return name;
}

std::string workspace_formula(const Group& g) {
  return (g.count > 1 ? num(g.count) + " x " : "") + (g.shape.empty() ? num(g.numel) : g.shape) + " x " +
         num(static_cast<int64_t>(ops::element_size(g.dtype)));
}

// LlamaModel::workspace_specs for the run (the trainer's model options).
std::vector<BufferSpec> model_buffers(const Run& r) {
  return model::LlamaModel::workspace_specs(r.mc, model::options_for(r.cfg, r.cuda), r.dtype, r.batch, r.seq, true);
}

// ---------------------------------------------------------------------------------------
// The parameter store and the model, replayed.
// ---------------------------------------------------------------------------------------
// The model's construction and the parameter store's set-up (zero/param_store.h: the state
// this rank keeps, then allocate_step_buffers) run on recording backends: what is live
// afterwards is the persistent set of "init"; what the set-up frees on the way (none today:
// ZeRO-3 loads only its shards) would make the init phase's peak, one item per memory.
void parameter_items(const Run& r, const PlanTarget& t, Items& it) {
  AllocRecorder dev, host;
  RecordingOptions ro;
  ro.space = r.cuda ? MemSpace::Device : MemSpace::Host;
  ro.pinned = r.cuda ? &host : nullptr;
  ro.deterministic = r.cfg.train.deterministic;
  const std::unique_ptr<ops::Backend> be = make_recording_backend(dev, ro);
  zero::StoreOptions so = zero::store_options(r.cfg);
  so.host_backend = [&host] { return make_recording_backend(host, {}); };
  const MemSpace cs = r.cuda ? MemSpace::Device : MemSpace::Host;  // NCCL with CUDA, else MPI
  const int W = t.world(), G = r.groups.sp_size > 1 ? W : r.groups.dp_size, R = W / static_cast<int>(r.zero_group);
  const auto world = make_recording_comm("world", W, 0, cs), grads = make_recording_comm("grads", G, 0, cs);
  const auto zero = make_recording_comm("zero", static_cast<int>(r.zero_group), 0, cs);
  const auto replica = make_recording_comm("zero_replica", R, 0, cs);
  {
    const model::LlamaModel model(r.mc, *be, r.dtype, model::options_for(r.cfg, r.cuda));
    const std::unique_ptr<zero::ParamStore> store = zero::make_param_store(
        r.layout, *be, r.dtype, so, {world.get(), grads.get(), zero.get(), R > 1 ? replica.get() : nullptr});
    store->allocate_step_buffers();
    const std::string src = r.zero3() ? "zero/sharded_store.cpp" : "zero/replicated_store.cpp";
    add_recorded(it, false, "init", dev.live(), r.dev, true, src);
    add_recorded(it, false, "init", host.live(), "host", !r.cuda, src);
    it.transient("init", "parameter set-up: buffers freed before the first step", r.dev,
                 dev.peak_bytes() - dev.live_bytes(), "peak of the replay of " + src);
    it.transient("init", "parameter set-up: host buffers freed before the first step", "host",
                 host.peak_bytes() - host.live_bytes(), "peak of the replay of " + src, false);
  }
}

// ---------------------------------------------------------------------------------------
// The plan's parts, phase by phase.
// ---------------------------------------------------------------------------------------
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

// The process and the backend: calibrated constants and the CUDA backend's own buffers; one
// rule for the training and the inference plans. The host baseline is this program's own
// footprint when the plan is made in it, before it allocates (the trainer plans first thing;
// --plan for the CPU backend; an evaluation program's session on the CPU): the libraries it
// links (a CUDA build maps cuDNN, cuBLASLt and NCCL even for the CPU backend), MPI, the config.
// On CUDA the driver's host side comes later, with the context: the calibrated constant bounds it.
void process_and_backend_items(const Run& r, const PlanTarget& t, Items& it) {
  if (r.cuda) {
    it.persistent("init", "CUDA context, cuBLASLt/cuDNN handles, NCCL (constant)", "gpu", kCudaContextBytes,
                  "kCudaContextBytes (calibrated; not a backend allocation)", false);
    for (const ops::ScratchBuffer& b : ops::cuda_own_bytes().list())
      it.persistent("init", b.name, "gpu", b.bytes, b.formula);
  }
  const int64_t fixed = r.cuda ? kHostBaselineCudaBytes : kHostBaselineCpuBytes;
  const bool measured = t.process_bytes > fixed;
  it.persistent("init", "process baseline (program, libraries, MPI" + std::string(r.cuda ? ", CUDA host side)" : ")"),
                "host", measured ? t.process_bytes : fixed,
                measured ? "VmRSS of this process before allocating (measured)"
                : r.cuda ? "kHostBaselineCudaBytes (calibrated)"
                         : "kHostBaselineCpuBytes (calibrated)",
                false);
}

void process_items(const Run& r, const PlanTarget& t, Items& it) {
  process_and_backend_items(r, t, it);
  // Loading the weights (ParamStore::load_master, read_checkpoint): each unit's part this rank
  // keeps (stage 0: the whole unit; ZeRO-3: its shard) is read into the state where that is
  // host memory (the CPU backend, offload_optimizer), else through a host staging of one part.
  const zero::ShardLayout sl = r.shards();
  auto part = [&](size_t u) { return r.zero3() ? sl.len(u) : r.layout.units()[u].numel; };
  if (r.cuda && (!r.offload_opt() || r.split_opt())) {  // (a split: the units whose state is on the GPU)
    int64_t most = 0;
    for (size_t u = 0; u < r.layout.num_units(); ++u)
      if (!r.layout.units()[u].frozen) most = std::max(most, part(u));
    it.transient("init", "host staging of one unit's part being loaded (f32)", "host", 4 * most,
                 r.zero3() ? "4 x max ceil(unit / Z)" : "4 x largest unit", false);
  }
  // LoRA's frozen units: f32 read and converted to bf16 on the host, a chunk at a time.
  int64_t frozen = 0;
  for (size_t u = 0; u < r.layout.num_units(); ++u)
    if (r.layout.units()[u].frozen) frozen = std::max(frozen, std::min(part(u), kOffloadChunkElems));
  if (r.cuda && frozen > 0)
    it.transient("init", "host staging of a frozen unit's chunk being loaded (f32 + bf16)", "host", 6 * frozen,
                 "6 x min(largest frozen unit part, 2^24)", false);
  // model.init hf:DIR: SafetensorsReader::read_range's buffer (disk bytes of the elements read,
  // at most kReadChunkBytes at once; F64 on disk at most).
  if (starts_with(r.cfg.model.init, "hf:")) {
    int64_t largest = 0;
    for (const model::ParamUnit& u : r.layout.units())
      for (const model::ParamTensor& pt : u.tensors) largest = std::max(largest, pt.numel);
    const int64_t kept = r.zero3() ? std::min(largest, r.shards().max_len()) : largest;
    it.transient("init", "safetensors read buffer (model.init hf:)", "host",
                 std::min<int64_t>(8 * kept, static_cast<int64_t>(ckpt::SafetensorsReader::kReadChunkBytes)),
                 "min(8 x largest tensor part read, SafetensorsReader::kReadChunkBytes)", false);
  }
}

// From the first step on: the micro-batch and the model's workspace.
void step_items(const Run& r, Items& it) {
  const int64_t n = r.tokens;
  if (r.cuda)
    it.persistent("step", "micro-batch on the device (tokens, positions, labels)", "gpu", 3 * 4 * n, "3 x 4 x n");
  // Per sequence: its sample id and its document starts (a vector of one start, 32 bytes with
  // its header; with data.document_mask at most one 8-byte start per token of the window).
  const bool docs = r.cfg.data.document_mask;
  const int64_t per_seq = docs ? 40 + 8 * r.cfg.data.seq_length : 40;
  const int64_t mb = checked_mul<int64_t>(r.cfg.train.grad_accum, 3 * 4 * n + per_seq * r.batch,
                                          "the plan: loader micro-batch bytes, train.grad_accum x (12 n + starts)");
  it.persistent("step", "loader micro-batches (int32 tokens, positions, labels; document starts)", "host", mb,
                docs ? "grad_accum x (3 x 4 x n + (40 + 8 L) B)" : "grad_accum x (3 x 4 x n + 40 B)", false);
  for (const Group& g : group_specs(model_buffers(r))) {
    const int64_t each = checked_mul(g.numel, static_cast<int64_t>(ops::element_size(g.dtype)), "the plan: " + g.key);
    const int64_t all = checked_mul(g.count, each, "the plan: " + g.key);
    const std::string f = workspace_formula(g);
    if (g.pinned_host) {  // activation.offload cpu: Backend::alloc_host_pinned (a backend buffer on the CPU)
      it.persistent("step", workspace_label(g) + (r.cuda ? " (offloaded, pinned)" : " (offloaded)"), "host", all, f,
                    !r.cuda);
      continue;
    }
    it.persistent("step", workspace_label(g), r.dev, all, f);
  }
}

// The backends' scratch inside the other ops, from the functions they size it with (ops/scratch.h).
void op_scratch_items(const Run& r, Items& it) {
  auto scratch = [&](const std::string& phase, const std::vector<ops::ScratchBuffer>& bufs, bool tracked) {
    for (const ops::ScratchBuffer& b : bufs) it.transient(phase, b.name, r.dev, b.bytes, b.formula, tracked);
  };
  const int64_t n = r.tokens, V = r.mc.vocab_size, tile = r.cfg.activation.lm_head_tile;
  if (!r.cuda) {  // cpu::lm_head_loss keeps its tile and the per-token NLL on the heap (not backend buffers)
    scratch("LM head + loss", ops::cpu_lm_head_scratch(n, V, tile, 4).list(), false);
    return;
  }
  scratch("LM head + loss", ops::cuda_lm_head_scratch(n, V, tile, true, true).list(), true);
  scratch("RMSNorm backward", ops::rmsnorm_bwd_scratch(n, r.mc.hidden_size).list(), true);
  scratch("embedding backward", ops::embedding_bwd_scratch(n).list(), true);
  scratch("gradient clip", ops::sum_squares_scratch().list(), true);
}

// Gradient reduction over MPI (the CPU backend): MpiComm sums floats in rank order through
// heap copies, unit by unit: all_reduce holds the padded send, the received blocks and its
// own block; reduce_scatter the received blocks (then the replicas' all_reduce).
void reduction_items(const Run& r, const PlanTarget& t, Items& it) {
  if (r.cuda) return;
  int64_t unit = 0, len = 0;  // (the trainable units: LoRA's frozen ones have no gradient)
  const zero::ShardLayout sl = r.shards();
  for (size_t u = 0; u < r.layout.num_units(); ++u)
    if (!r.layout.units()[u].frozen) {
      unit = std::max(unit, r.layout.units()[u].numel);
      len = std::max(len, sl.len(u));
    }
  auto all_reduce = [](int64_t count, int64_t ranks) {
    const int64_t block = (count + ranks - 1) / ranks;
    return 4 * (2 * block * ranks + block);
  };
  const int64_t G = r.groups.sp_size > 1 ? t.world() : r.groups.dp_size, R = t.world() / r.zero_group;
  int64_t bytes = 0;
  if (!r.zero3() && G > 1) bytes = all_reduce(unit, G);
  if (r.zero3() && r.zero_group > 1) bytes = 4 * len * r.zero_group;
  if (r.zero3() && R > 1) bytes = std::max(bytes, all_reduce(len, R));
  it.transient("gradient reduce", "MPI rank-ordered sum buffers (heap, largest unit)", "host", bytes,
               r.zero3() ? "4 x Z x ceil(unit / Z)" : "4 x (2 G + 1) x ceil(unit / G), G = ranks summing", false);
}

// Host staging of checkpoints and the export (CUDA stage 0: the slices this rank writes).
void save_items(const Run& r, const PlanTarget& t, Items& it) {
  const OutputConfig& out = r.cfg.output;
  const zero::ShardLayout sl = r.shards();
  int64_t trained_len = 0, trained_max = 0;  // (LoRA: the trainable units' shards only)
  for (size_t u = 0; u < r.layout.num_units(); ++u)
    if (!r.layout.units()[u].frozen) {
      trained_len += sl.len(u);
      trained_max = std::max(trained_max, sl.len(u));
    }
  if (r.cuda && (!r.offload_opt() || r.split_opt()) && (out.save_final || out.save_every > 0)) {
    const int64_t W = t.world();
    const int64_t state = r.zero3() ? trained_len : (r.trained + W - 1) / W;
    const std::string f = r.zero3() ? "3 x 4 x sum ceil(unit / Z)" : "3 x 4 x P / W (the slices this rank writes)";
    it.transient("checkpoint save", "host staging of master, m, v (f32)", "host", 12 * state, f, false);
  }
  if (!out.export_hf) return;
  // The HF export (Trainer::save_hf): rank 0 holds the whole fp32 model (ParamStore::
  // master_host_at_root) and writes it one safetensors file of at most 5 GB at a time, each
  // built in memory (ckpt::write_safetensors_sharded).
  // (LoRA: the trainable units only, into one adapter file)
  const bool lora = r.layout.lora().enabled();
  const int64_t disk = r.cfg.output.hf_dtype == "bf16" ? 2 : 4, P = r.trained;
  const int64_t file = lora ? disk * P : std::min<int64_t>(disk * P, int64_t{5} << 30);
  const std::string phase = r.zero3() ? "HF export (gather)" : "HF export (rank 0)";
  const char* what = lora ? " trainable" : "";
  if (!r.zero3()) {
    it.transient(phase, std::string("the whole") + what + " master weights copied for the export (f32, heap)", "host",
                 4 * P, "4 P", false, Ranks::Root);
  } else {  // every unit gathered in turn; rank 0 keeps each, the others one at a time
    const int64_t Z = r.zero_group;
    it.transient(phase, std::string("the whole") + what + " master weights gathered on rank 0 (f32, heap)", "host",
                 4 * Z * trained_len, "4 x Z x sum ceil(unit / Z)", false, Ranks::Root);
    if (t.world() > 1)
      it.transient(phase, "one unit gathered (f32, heap; rank 0 keeps them all)", "host", 4 * Z * trained_max,
                   "4 x Z x max ceil(unit / Z)", false, Ranks::Others);
    if (r.cuda)
      it.transient(phase, "one unit gathered on the device (f32)", "gpu", 4 * r.zero_group * trained_max,
                   "4 x Z x max ceil(unit / Z)");
  }
  it.transient(phase,
               lora ? "the adapter file being written (in memory)" : "a safetensors file being written (in memory)",
               "host", file,
               lora ? std::to_string(disk) + " P (P: the trainable parameters)"
                    : "min(" + std::to_string(disk) + " P, 5 GiB): the writer's shards",
               false, Ranks::Root);
}

// Every phase's totals: the persistent items of its time (init's, or all from the first step
// on) plus its own transient ones; the peaks over phases and what they fit in.
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
