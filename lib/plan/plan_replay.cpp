// The memory plan's replays: the attention strategies, the model's construction and the
// parameter store's set-up run on recording backends and communicators (plan/recorder.h), and
// what they allocate becomes the plan's items.
#include <algorithm>
#include <cmath>
#include <memory>

#include "attention/strategy.h"
#include "core/checked.h"
#include "plan/plan_items.h"
#include "zero/param_store.h"

namespace easyctx::plan::detail {

namespace {

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

}  // namespace

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

}  // namespace easyctx::plan::detail
