#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "attention/documents.h"
#include "attention/strategy.h"
#include "ckpt/convert.h"
#include "ckpt/hf_model.h"
#include "ckpt/rank_sync.h"
#include "ckpt/sharded_checkpoint.h"
#include "ckpt/tokenizer_files.h"
#include "core/log.h"
#include "core/strings.h"
#include "data/loader.h"
#include "data/sp_slice.h"
#include "dist/comm_mpi.h"
#include "dist/signals.h"
#include "ops/backend_factory.h"
#include "plan/memory_plan.h"
#include "plan/target.h"
#include "train/data_stats.h"
#include "train/schedule.h"
#include "zero/host_adamw.h"

namespace easyctx::train {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

void check_supported(const StageConfig& cfg) {
  EASYCTX_CHECK_INPUT(cfg.activation.mlp_tile == 0 || cfg.activation.checkpoint != CheckpointPolicy::None,
                      "activation.mlp_tile: ", cfg.activation.mlp_tile,
                      " needs activation.checkpoint layer or "
                      "attention_output (with none every layer keeps its whole MLP activations); set it to 0");
  validate_activation(cfg);
  EASYCTX_CHECK_INPUT(!cfg.data.path.empty(), "data.path: empty; give the h5tokenize output (file, folder or glob)");
}

// Packed data (best_fit, one_per_window): how many sequences an epoch has, how much of them is
// padding, and how many steps an epoch takes, so that train.steps can be set in epochs.
std::string packing_line(const StageConfig& cfg, const data::DataLoader& loader, int64_t dp_size) {
  const uint64_t n = loader.sequences_per_epoch();
  const int64_t g = cfg.train.batch_size * cfg.train.grad_accum * dp_size;
  const double slots = static_cast<double>(n) * static_cast<double>(cfg.data.seq_length);
  const double pad = slots > 0 ? 100.0 * (1.0 - static_cast<double>(loader.packed_tokens()) / slots) : 0;
  char pct[32];
  std::snprintf(pct, sizeof(pct), "%.1f", pad);
  return "data.packing " + loader.packing_name() + ": " + std::to_string(n) + " sequences per epoch (" + pct +
         "% padding), " + std::to_string((n + static_cast<uint64_t>(g) - 1) / g) + " steps per epoch at " +
         std::to_string(g) + " sequences per step" + (cfg.data.document_mask ? "; document masking on" : "");
}

// data.document_mask with sequence parallelism: how evenly the first window's attention work
// (query-key pairs inside documents and the window) falls on the ranks that compute it. The
// zigzag split balances a causal square, not packed documents; the loader orders best-fit
// windows' documents for the zigzag and usp rings (data/doc_balance.h), other packings and
// dist_flash keep theirs: measured here, not assumed.
std::string document_balance(const data::MicroBatch& mb, const attention::SequenceSplit& split, int64_t L,
                             const model::LlamaConfig& mc) {
  if (split.size <= 1 || mb.doc_starts.empty()) return "";
  if (split.layout == SpLayout::Contiguous && split.inner == split.size)
    return "document mask: ulysses attends over the whole sequence for each rank's heads: every rank's work is equal";
  const bool usp = split.layout == SpLayout::Usp;
  const int ranks = usp ? split.size / split.inner : split.size;  // usp: the ring's ranks share by heads
  const SpLayout layout = usp ? SpLayout::Zigzag : split.layout;
  // usp: the ring's zigzag over its padded length (a multiple of 2 x the ring: no more padding)
  const int64_t len = usp ? split.padded_length(L) : L;
  std::vector<double> work;
  for (int r = 0; r < ranks; ++r) {
    double pairs = 0;  // over the layers: those with the window and those without
    const int64_t windowed = mc.windowed_layers(), full = mc.num_layers - windowed;
    for (const auto& [a, b] : data::sp_rank_ranges(len, layout, ranks, r))
      pairs += static_cast<double>(windowed) *
                   static_cast<double>(attention::visible_pairs(mb.doc_starts[0], a, b, mc.sliding_window)) +
               static_cast<double>(full) * static_cast<double>(attention::visible_pairs(mb.doc_starts[0], a, b, 0));
    work.push_back(pairs);
  }
  const double mean = std::accumulate(work.begin(), work.end(), 0.0) / ranks;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "document mask: the first window's attention pairs per %s rank: max %.2f, min %.2f of the mean "
                "(%zu documents; docs/data.md, \"Balance over sequence-parallel ranks\")",
                usp ? "ring" : "sequence-parallel", *std::max_element(work.begin(), work.end()) / mean,
                *std::min_element(work.begin(), work.end()) / mean, mb.doc_starts[0].size());
  return buf;
}

// Dynamic RoPE's length of a micro-batch, as transformers computes it from the position ids of
// the unpadded L-token sequences (the same on every sequence-parallel rank): L, or with the
// document mask (positions restarting per document) the longest document's part before L.
int64_t rope_length(const data::MicroBatch& mb, int64_t L, bool document_mask) {
  if (!document_mask) return L;
  int64_t longest = 0;
  for (const attention::DocumentStarts& s : mb.doc_starts)
    for (size_t d = 0; d < s.size() && s[d] < L; ++d)
      longest = std::max(longest, std::min(d + 1 < s.size() ? s[d + 1] : L, L) - s[d]);
  return longest;
}

}  // namespace

DeviceKind trainer_device(DeviceKind requested) { return ops::resolve_device(requested, "train.device"); }

Trainer::Trainer(const StageConfig& cfg, dist::Comm& world, dist::Comm& dp, const RunOptions& opts)
    : cfg_(cfg),
      device_(trainer_device(cfg.train.device)),
      world_(world),
      dp_(dp),
      grad_comm_(dp),
      zero_(&world),
      // (the checkpoint's exchanges: the world communicator's own ranks, which may be a subset)
      world_mpi_(dynamic_cast<dist::MpiComm*>(&world) ? dynamic_cast<dist::MpiComm*>(&world)->mpi_comm()
                 : world.size() == 1                  ? MPI_COMM_SELF
                                                      : MPI_COMM_WORLD),
      ranks_per_node_(world.size()),
      opts_(opts) {
  check_supported(cfg_);
  EASYCTX_CHECK_INPUT(cfg_.parallel.sequence.size == 1, "parallel.sequence.size: ", cfg_.parallel.sequence.size,
                      ": this trainer was built without process groups (sequence parallelism needs them)");
  init(nullptr);
}

Trainer::Trainer(const StageConfig& cfg, dist::ProcessGroups& groups, const RunOptions& opts)
    : cfg_(cfg),
      device_(trainer_device(cfg.train.device)),
      world_(groups.world()),
      dp_(groups.dp()),
      grad_comm_(groups.layout().sp_size > 1 ? groups.world() : groups.dp()),
      zero_(&groups.zero()),
      zero_replica_(groups.zero_replica().size() > 1 ? &groups.zero_replica() : nullptr),
      world_mpi_(MPI_COMM_WORLD),
      ranks_per_node_(groups.layout().ranks_per_node),
      opts_(opts) {
  check_supported(cfg_);
  init(&groups);
}

// The memory plan first (docs/memory-model.md): a run that would not fit is refused before
// anything is allocated, naming the knobs that would make it fit. The auto choices it makes are
// written into cfg_, the same on every rank.
void Trainer::plan_memory() {
  plan_ = std::make_shared<plan::MemoryPlan>(plan::plan_for_run(cfg_, world_.size(), ranks_per_node_));
  EASYCTX_CHECK_INPUT(plan_->fits, plan::refusal_message(*plan_),
                      " (the whole plan: easyctx_train STAGE.yaml --plan; target.headroom loosens the margin)");
  // One auto choice on every rank: this rank's plan's (`own`), reduced over the ranks with
  // `agree` when `collective`, written into cfg_ by `apply`. Returns it when it is not `own`
  // (this rank's plan is then made again for the config as it now is), else "".
  const auto take_choice = [&](const std::string& own, bool collective, const char* what, const char* choosing,
                               auto agree, auto apply) {
    std::string choice = own;
    if (collective) {
      ckpt::RankSync sync(world_mpi_, cfg_.parallel.collective_timeout_s, what);
      choice = sync.reduce(choice, "planning its memory", choosing, agree);
    }
    apply(cfg_, choice);
    if (choice == own) return std::string();
    plan_ = std::make_shared<plan::MemoryPlan>(plan::plan_for_run(cfg_, world_.size(), ranks_per_node_));
    return choice;
  };
  // parallel.zero.offload_optimizer auto: the plan chose the optimizer's place (and, to keep it
  // on the GPU, perhaps some layer inputs in host memory); all below (the parameter store, the
  // activation offload, the checkpoint's config) follows that choice. One placement on every
  // rank (plan::agree_placement; be_ does not exist yet, so only a CUDA world reduces).
  if (cfg_.parallel.zero.offload_optimizer_auto) {
    const std::string choice = take_choice(plan::placement_of(*plan_), world_.size() > 1 && device_ == DeviceKind::Cuda,
                                           "parallel.zero.offload_optimizer auto", "choosing the optimizer's place",
                                           plan::agree_placement, plan::apply_placement);
    if (!choice.empty()) {  // this rank's plan differs from the one every rank takes
      const int64_t host_layers = plan::placement_optimizer_layers(choice);
      const std::string placed =
          choice == "host" ? "in host memory"
          : host_layers > 0
              ? "split, the last " + std::to_string(host_layers) + " layers' and the head's in host memory"
              : "on the GPU with the inputs of the first " + std::to_string(plan::placement_offload_layers(choice)) +
                    " layers in host memory";
      plan_->notes.push_back("parallel.zero.offload_optimizer auto: " + placed + ", as another rank's plan needs it");
      EASYCTX_CHECK_INPUT(plan_->fits, plan::refusal_message(*plan_), " (with the optimizer ", placed,
                          ", as another rank's plan needs it; the whole plan: easyctx_train STAGE.yaml --plan)");
    }
  }
  // activation.checkpoint auto: the plan (of the placed optimizer) chose; one choice on every
  // rank, since a ring's attention recompute is collective (plan::agree_checkpoint).
  if (cfg_.activation.checkpoint_auto &&
      !take_choice(plan_->auto_checkpoint, world_.size() > 1, "activation.checkpoint auto",
                   "choosing the activation checkpoints", plan::agree_checkpoint, plan::apply_checkpoint)
           .empty()) {
    plan_->notes.push_back("activation.checkpoint auto: layer, as the ranks' plans chose differently");
    EASYCTX_CHECK_INPUT(plan_->fits, plan::refusal_message(*plan_),
                        " (with activation.checkpoint layer, as the ranks' "
                        "plans chose differently; the whole plan: easyctx_train STAGE.yaml --plan)");
  }
}

// The data loader: this rank's share of every batch, checked against the vocabulary (and its
// loss weights counted: data/loader.h LabelCensus) before the run is recorded in output.dir, so
// that bad data changes nothing there (--resume none archives the earlier run only after this).
void Trainer::make_loader(dist::ProcessGroups* groups, int64_t vocab_size) {
  data::LoaderOptions lo;
  lo.path = cfg_.data.path;
  lo.seq_length = cfg_.data.seq_length;
  lo.seed = cfg_.train.seed;
  lo.packing = cfg_.data.packing;
  lo.long_documents = cfg_.data.long_documents;
  lo.document_mask = cfg_.data.document_mask;
  lo.shape = {cfg_.train.batch_size, cfg_.train.grad_accum, dp_.size()};
  lo.dp_rank = dp_.rank();
  if (groups) {  // this rank's slice of every window, in the layout of the strategy
    const attention::SequenceSplit split = attention::sequence_split(groups->layout());
    sp_split_ = split;
    lo.sp_layout = split.layout;
    lo.sp_size = split.size;
    lo.sp_rank = groups->sp().rank();
    lo.sp_inner = split.inner;
  }
  loader_ = std::make_unique<data::DataLoader>(lo);
  loader_->validate(vocab_size, "", cfg_.data.check_tokens);
}

// The checkpoint's data cursor, once the loader exists and the checkpoint is chosen.
void Trainer::restore_data_cursor() {
  if (!resumed_data_state_.empty()) {
    // Same data, seed, sequence length and global batch as the run that saved, or a clear refusal.
    const data::LoaderState s = data::LoaderState::from_json(resumed_data_state_);
    loader_->restore(s);
    EASYCTX_CHECK_INPUT(s.next_step == start_step_, "checkpoint data cursor at step ", s.next_step,
                        " but its index says step ", start_step_);
  }
}

// Model, weights, optimizer state and data; without process groups, local attention.
void Trainer::init(dist::ProcessGroups* groups) {
  plan_memory();
  be_ = ops::make_backend(device_, {cfg_.train.deterministic, cfg_.logging.profile, cfg_.train.hopper_attention});
  // Device communicators (NCCL) need device buffers; host communicators (MPI) serve a CUDA
  // trainer too, with the gradients staged through host memory.
  for (const dist::Comm* c : {&world_, &dp_, &grad_comm_})
    EASYCTX_CHECK_INPUT(c->memspace() == MemSpace::Host || on_device(), "train.device: ", to_string(cfg_.train.device),
                        " chose ", c->backend(),
                        " communicators, but the trainer runs "
                        "the ",
                        be_->name(), " backend; set train.device: cuda (or run with MPI communicators)");
  std::shared_ptr<attention::SequenceAttention> attn =
      groups ? attention::make_sequence_attention(cfg_, *groups, *be_) : attention::make_local_attention(cfg_, *be_);
  const model::LlamaConfig mc = model::resolve_llama_config(cfg_.model);
  model_ = std::make_unique<model::LlamaModel>(mc, *be_, on_device() ? DType::BF16 : DType::F32,
                                               model::options_for(cfg_, on_device()), std::move(attn));
  store_ = zero::make_param_store(model_->layout(), *be_, model_->dtype(), zero::store_options(cfg_),
                                  {&world_, &grad_comm_, zero_, zero_replica_});
  make_loader(groups, mc.vocab_size);
  load_weights();
  restore_data_cursor();
  store_->finish_loading();
  report_ = std::make_unique<StepReporter>(cfg_, *be_, world_.size(), world_.rank() == 0, flops_per_token(),
                                           attention_flops_per_token());
  report_->log_device();
}

Trainer::~Trainer() = default;

// LoRA: a frozen matrix costs 4 FLOPs per weight and token (forward, and the input gradient
// of the backward; its weight gradient is skipped), a trained one (an adapter, a trained
// lm_head) 6.
double Trainer::flops_per_token() const {
  const model::LlamaConfig& c = model_->config();
  const model::LoraSpec& lora = model_->layout().lora();
  const double d = static_cast<double>(c.hidden_size), L = static_cast<double>(c.num_layers);
  const double per_layer =
      d * static_cast<double>(2 * c.q_dim() + 2 * c.kv_dim()) + 3.0 * d * static_cast<double>(c.intermediate_size);
  const double head = static_cast<double>(c.vocab_size) * d;  // the LM head
  if (!lora.enabled()) return 6.0 * (L * per_layer + head) + attention_flops_per_token();
  double adapters = 0;  // per token: A and B of every targeted projection of every layer
  for (const model::ParamUnit& u : model_->layout().units())
    for (const model::ParamTensor& t : u.tensors)
      if (t.adapter) adapters += static_cast<double>(t.numel);
  return 4.0 * L * per_layer + (lora.lm_head ? 6.0 : 4.0) * head + 6.0 * adapters + attention_flops_per_token();
}

double Trainer::attention_flops_per_token() const {
  const model::LlamaConfig& c = model_->config();
  return 6.0 * static_cast<double>(c.num_layers) * static_cast<double>(c.hidden_size) *
         static_cast<double>(cfg_.data.seq_length);
}

void Trainer::save_checkpoint(int64_t steps_done) {
  if (steps_done == last_saved_step_) {
    log_info("checkpoint of step ", steps_done, " already committed by this run: kept, not written again");
    return;
  }
  store_->settle();
  ckpt::WriterOptions wo;
  wo.run_id = run_id_;
  wo.config_hash = config_hash_;
  wo.aside_dir = (fs::path(cfg_.output.dir) / "previous").string();
  wo.timeout_s = cfg_.parallel.collective_timeout_s;
  ckpt::CheckpointWriter w(world_mpi_, (fs::path(cfg_.output.dir) / "checkpoints").string(), steps_done, wo);
  zero::ParamStore::CheckpointStaging staging;  // (alive until the commit)
  store_->write_checkpoint(w, staging);
  // Per rank: the data cursor (sampling is a pure function of seed and step, so it is the
  // step plus what must not change) and the RNG state (none is drawn after initialisation).
  data::LoaderState ls = loader_->state();
  ls.next_step = steps_done;
  ls.next_micro = 0;
  Json rank_meta = Json::object();
  rank_meta.set("data", parse_json(ls.to_json(), "loader state"));
  rank_meta.set("rng", "none: initialisation and data order are pure functions of (train.seed, step)");
  w.set_rank_meta(rank_meta);
  Json meta = Json::object();
  meta.set("next_step", steps_done);
  // (a resume continues Adam's step count and the run's count of steps without labels)
  meta.set("optimizer_updates", updates_);
  meta.set("steps_without_labels", no_label_steps_);
  meta.set("tokens_seen", static_cast<int64_t>(ls.global_batch) * cfg_.data.seq_length * steps_done);
  Json layout = Json::object();
  layout.set("world", world_.size());
  layout.set("data_parallel", dp_.size());
  layout.set("sequence_parallel", world_.size() / dp_.size());
  layout.set("sequence_mode", to_string(cfg_.parallel.sequence.mode));
  layout.set("zero_stage", cfg_.parallel.zero.stage);
  layout.set("zero_group", cfg_.parallel.zero.stage == 3 ? zero_->size() : 1);
  meta.set("layout", layout);
  meta.set("model", model_->config().to_hf_json());
  if (model_->layout().lora().enabled()) meta.set("lora", lora_meta());  // (the base it needs)
  meta.set("config", dump_stage_config(cfg_));
  const std::string dir = w.commit(meta, cfg_.output.keep_last);
  last_saved_step_ = steps_done;
  log_info("checkpoint ", dir, w.skipped() ? " (already committed by this run and verified: kept)" : "");
}

StepStats Trainer::train_step(int64_t step) {
  const auto t0 = Clock::now();
  StepStats st = compute_gradients(step);
  if (st.no_labels) {  // nothing to learn from: weights, Adam moments and step count stay
    log_no_labels(step);
    st.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    report_->end_step(st);
    return st;
  }
  be_->synchronize();  // (a device backend: the gradients are final; no cost worth naming)
  st.fwd_bwd_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  st.grad_norm = store_->clip(cfg_.train.grad_clip);
  report_->phase("clip");
  // Loss and norm are global sums, the same on every rank: every rank decides alike.
  if (!std::isfinite(st.loss) || !std::isfinite(st.grad_norm)) {
    const std::string what = detail::concat("step ", step + 1, ": loss ", st.loss, ", gradient norm ", st.grad_norm);
    EASYCTX_CHECK(cfg_.train.on_nonfinite == NonFinitePolicy::SkipStep, what,
                  ": not finite; stopping before the update (nothing of this step is applied or checkpointed; "
                  "the last checkpoint is intact). Resume with a lower train.lr, or set train.on_nonfinite: "
                  "skip_step to skip such steps");
    log_warn(what, ": not finite; step skipped, weights and Adam moments unchanged (train.on_nonfinite: skip_step)");
    st.skipped = true;
    st.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    report_->end_step(st);
    return st;
  }
  // The host AdamW overlaps the next step's forward when this run has a next step (the step
  // time then counts the wait for it there, so each step line is the steady-state time), and
  // not while profiling (its phase would vanish into the forward).
  const ops::AdamWStep s{st.lr, cfg_.train.beta1, cfg_.train.beta2, cfg_.train.eps, 0.0, updates_ + 1};
  store_->optimizer_step(s, cfg_.train.weight_decay, step + 1 < cfg_.train.steps && !report_->profiling());
  ++updates_;
  be_->synchronize();  // device backends: the step is done when its queued work is
  report_->phase("optimizer");
  st.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (cfg_.parallel.zero.offload_optimizer) {
    const zero::HostAdamWTimes ht = store_->take_host_optimizer_times();
    st.host_optimizer_s = ht.seconds;
    st.host_optimizer_exposed_s = ht.waited;
    st.host_optimizer_gb_s = ht.gb_per_s();
  }
  report_->end_step(st);
  return st;
}

StepStats Trainer::compute_gradients(int64_t step) {
  StepStats st;
  st.step = step;
  st.lr = lr_at(cfg_.train, step);
  // Data first: the loss denominator is the global count of labelled tokens.
  std::vector<data::MicroBatch> micro;
  double local_labels = 0;
  for (int64_t m = 0; m < cfg_.train.grad_accum; ++m) {
    micro.push_back(loader_->micro_batch(step, m));
    local_labels += static_cast<double>(micro.back().real_labels);
  }
  if (!balance_logged_ && cfg_.data.document_mask && world_.rank() == 0) {
    const std::string line = document_balance(micro[0], sp_split_, cfg_.data.seq_length, model_->config());
    if (!line.empty()) log_info(line);
  }
  balance_logged_ = true;
  const double global_labels = world_.all_reduce_scalar(local_labels, dist::ReduceOp::Sum);
  if (global_labels == 0) {  // (the same sum on every rank: every rank returns here)
    st.no_labels = true;
    for (const data::MicroBatch& mb : micro) st.tokens += mb.batch * mb.local_len;
    st.tokens = static_cast<int64_t>(world_.all_reduce_scalar(static_cast<double>(st.tokens), dist::ReduceOp::Sum));
    report_->phase("data");
    return st;
  }
  report_->phase("data");
  store_->begin_step();
  if (cfg_.data.document_mask || model_->config().sliding_window > 0) st.attention_share = attention_share(micro);
  double sum_nll = 0;
  for (int64_t m = 0; m < static_cast<int64_t>(micro.size()); ++m) {
    data::MicroBatch& mb = micro[static_cast<size_t>(m)];
    const int64_t n = mb.batch * mb.local_len;
    model::Batch b{ops::Tensor(mb.tokens.data(), DType::I32, {n}), ops::Tensor(mb.positions.data(), DType::I32, {n}),
                   ops::Tensor(mb.labels.data(), DType::I32, {n}), mb.batch, mb.local_len};
    if (cfg_.data.document_mask) b.documents = &mb.doc_starts;  // the attention's per-document blocks
    b.rope_length = rope_length(mb, cfg_.data.seq_length, cfg_.data.document_mask);
    if (on_device()) {  // host int32 arrays -> device buffers (ordered before the model)
      if (tokens_dev_.numel() != n) {
        tokens_dev_ = be_->alloc(DType::I32, n, "micro-batch tokens");
        positions_dev_ = be_->alloc(DType::I32, n, "micro-batch positions");
        labels_dev_ = be_->alloc(DType::I32, n, "micro-batch labels");
      }
      be_->copy(tokens_dev_.flat(), b.tokens);
      be_->copy(positions_dev_.flat(), b.positions);
      be_->copy(labels_dev_.flat(), b.labels);
      b.tokens = tokens_dev_.flat();
      b.positions = positions_dev_.flat();
      b.labels = labels_dev_.flat();
    }
    sum_nll += model_->forward_backward(store_->source(m), b, 1.0 / global_labels).sum_nll;
    store_->end_micro_batch(m);
    st.tokens += n;
  }
  report_->phase("forward+backward");
  store_->finish_reduction();
  st.loss = world_.all_reduce_scalar(sum_nll, dist::ReduceOp::Sum) / global_labels;
  st.tokens = static_cast<int64_t>(world_.all_reduce_scalar(static_cast<double>(st.tokens), dist::ReduceOp::Sum));
  st.labels = static_cast<int64_t>(global_labels);
  report_->phase("gradient reduction");
  return st;
}

// The attention pairs the model computes (inside documents, inside each layer's window; the
// layers without a window count whole) over a causal square's, for MFU: the global batch's
// sequences, averaged over the layers.
double Trainer::attention_share(const std::vector<data::MicroBatch>& micro) const {
  const model::LlamaConfig& mc = model_->config();
  const int64_t S = cfg_.data.seq_length, windowed = mc.windowed_layers();
  const double L = static_cast<double>(mc.num_layers);
  double pairs[2] = {0, 0};                 // attended (times L), causal
  for (const data::MicroBatch& mb : micro)  // doc_starts: one list per sequence ({0} without the mask)
    for (const attention::DocumentStarts& starts : mb.doc_starts) {
      const double w = static_cast<double>(attention::visible_pairs(starts, 0, S, mc.sliding_window));
      const double full =
          windowed == mc.num_layers ? 0 : static_cast<double>(attention::visible_pairs(starts, 0, S, 0));
      pairs[0] += (static_cast<double>(windowed) * w + (L - static_cast<double>(windowed)) * full) / L;
      pairs[1] += 0.5 * static_cast<double>(S) * static_cast<double>(S + 1);
    }
  return world_.all_reduce_scalar(pairs[0], dist::ReduceOp::Sum) /
         world_.all_reduce_scalar(pairs[1], dist::ReduceOp::Sum);
}

void Trainer::log_startup() const {
  const model::LlamaConfig& mc = model_->config();
  log_info("model ", mc.describe());
  const int64_t L = mc.num_layers, K = cfg_.activation.offload_layers;
  const std::string offloaded = cfg_.activation.offload != OffloadTarget::Cpu ? ""
                                : (K > 0 && K < L - 1)
                                    ? " (the first " + std::to_string(K) + " of " + std::to_string(L - 1) +
                                          " offloadable layer inputs "
                                          "in pinned host memory)"
                                    : " (offloaded to pinned host memory)";
  const bool streamed = model::options_for(cfg_, on_device()).streams_attention_output();
  const std::string groups = cfg_.activation.attention_head_groups > 1
                                 ? ", attention in " + std::to_string(cfg_.activation.attention_head_groups) +
                                       " head groups" +
                                       (streamed ? " (attention outputs streamed to host memory group by group)" : "")
                                 : "";
  const int64_t M = cfg_.activation.attention_output_layers;
  const std::string kept =
      cfg_.activation.checkpoint == CheckpointPolicy::AttentionOutput && M > 0 && M < L
          ? " (attention outputs kept in the last " + std::to_string(M) + " of " + std::to_string(L) + " layers)"
          : "";
  log_info("init ", cfg_.model.init, ", activation.checkpoint ", to_string(cfg_.activation.checkpoint), kept, offloaded,
           groups, ", backend ", be_->name(),
           on_device() ? " (bf16 parameters, fp32 gradients, master weights and Adam)" : " (f32)", ", ", world_.size(),
           " rank(s): data-parallel ", dp_.size(), " x sequence-parallel ", world_.size() / dp_.size(),
           world_.size() > dp_.size() ? std::string(" (") + to_string(cfg_.parallel.sequence.mode) + ")" : "");
  const std::string store = store_->describe();
  if (!store.empty()) log_info(store);
  for (const std::string& route : plan_->attention_routes) log_info("attention ", route);
  for (const std::string& note : plan_->notes) log_info("plan: ", note);
  if (world_.rank() != 0) return;  // the rest only informs the log (and reads data)
  const data::TokenDataset& ds = loader_->dataset();
  const UnigramStats us = unigram_stats(ds);
  log_info("data ", ds.spec(), ": ", format_count(static_cast<double>(ds.num_tokens())), " tokens, ", ds.num_docs(),
           " documents; unigram entropy ", us.entropy_nats, " nats (ppl ", std::exp(us.entropy_nats), ") over ",
           format_count(static_cast<double>(us.tokens)), " tokens, ", us.distinct,
           " distinct ids: a loss below it means the model uses context");
  if (cfg_.data.packing != DataPacking::Window) log_info(packing_line(cfg_, *loader_, dp_.size()));
  const data::LabelCensus& census = loader_->label_census();
  if (ds.has_loss_weights() || census.unlabelled > 0)
    log_info("data: ", census.unlabelled > 0 ? census.describe()
                                             : "every one of the " + std::to_string(census.units) +
                                                   (cfg_.data.packing == DataPacking::Window ? " windows" : " pieces") +
                                                   " holds a labelled token");
  if (!census.zero_weight_files.empty() && census.unlabelled == 0) log_warn("data: ", census.describe());
  log_info("global batch ", cfg_.train.batch_size, " x ", cfg_.train.grad_accum, " x ", dp_.size(), " x ",
           cfg_.data.seq_length, " = ",
           format_count(
               static_cast<double>(cfg_.train.batch_size * cfg_.train.grad_accum * dp_.size() * cfg_.data.seq_length)),
           " tokens/step, ", cfg_.train.steps, " steps, lr ", cfg_.train.lr, " (", to_string(cfg_.train.schedule),
           ", warmup ", cfg_.train.warmup_steps, ", min ", cfg_.train.min_lr, ")");
}

StepStats Trainer::run() {
  const bool root = world_.rank() == 0;
  if (root) write_plan();
  log_startup();
  report_->open_metrics(start_step_);
  const auto start = Clock::now();
  StepStats st;
  for (int64_t step = start_step_; step < cfg_.train.steps; ++step) {
    if (stop_requested()) {
      // Before this process trained a step, a new checkpoint would only repeat where the run
      // started, which --resume auto finds again (model.init, or the checkpoint resumed): a
      // preempted job's first seconds need not write a whole model.
      if (step == start_step_ && last_saved_step_ != step) {
        log_info("stop requested (", dist::agreed_stop().describe(), ") before the first step of this process: ",
                 "nothing trained, nothing saved; --resume auto starts where this run started");
      } else {
        save_checkpoint(step);
        log_info("stop requested (", dist::agreed_stop().describe(), "): checkpoint of step ", step,
                 " committed; continue with --resume auto");
      }
      stopped_ = true;
      world_.barrier();
      return st;
    }
    report_->begin_step(step, start_step_);
    st = train_step(step);
    // The metrics record first: a kill after the checkpoint commits never leaves its step
    // missing from metrics.jsonl (a kill before it is followed by a resume from an earlier
    // checkpoint, which rewrites the records from there identically).
    report_->record(step, start_step_, std::chrono::duration<double>(Clock::now() - start).count(), st);
    ckpt::fault_point("recorded", world_.rank(), step + 1);
    if (cfg_.output.save_every > 0 && (step + 1) % cfg_.output.save_every == 0 && step + 1 < cfg_.train.steps)
      save_checkpoint(step + 1);
  }
  if (cfg_.train.steps > start_step_ && cfg_.output.save_final) save_checkpoint(cfg_.train.steps);
  if (root)
    log_info(no_label_steps_, " of ", cfg_.train.steps, " steps had no labelled token (no update); ", updates_,
             " optimizer updates");
  report_->report_profile();
  if (root)
    log_info(plan::compare_line(*plan_, be_->memory_stats(), static_cast<double>(plan::vm_hwm_bytes()),
                                report_->peak_device_bytes()));
  // (ZeRO-3: every rank takes part in the gather)
  if (cfg_.output.export_hf && (root || cfg_.parallel.zero.stage == 3)) {
    const std::string dir = (fs::path(cfg_.output.dir) / "final").string();
    save_hf(dir);
    if (root)
      log_info("saved ", dir,
               model_->layout().lora().enabled()
                   ? " (a PEFT LoRA adapter: adapter_config.json + adapter_model.safetensors; merged: "
                     "easyctx_convert --merge-lora " +
                         dir + " --to hf:OUT)"
                   : " (Hugging Face safetensors + config.json)");
  }
  world_.barrier();
  if (root) write_file_atomic((fs::path(cfg_.output.dir) / "DONE").string(), std::to_string(cfg_.train.steps) + "\n");
  return st;
}

bool Trainer::stop_requested() { return static_cast<bool>(dist::agree_stop(world_)); }

// Rank 0 names where the global batch's sequences come from (the first steps of a process in
// full; the rest are counted, and marked no_labels in metrics.jsonl).
void Trainer::log_no_labels(int64_t step) {
  ++no_label_steps_;
  if (world_.rank() != 0 || no_label_described_ > 10) return;
  if (no_label_described_++ == 10) {
    log_info("further steps without a labelled token are not described here (metrics.jsonl marks them no_labels)");
    return;
  }
  const data::BatchShape& shape = loader_->options().shape;
  std::vector<std::string> seqs;
  for (int64_t m = 0; m < shape.grad_accum; ++m)
    for (int64_t p = 0; p < shape.dp_size; ++p)
      for (int64_t b = 0; b < shape.batch_size; ++b)
        seqs.push_back(loader_->describe_sample(data::sample_index(shape, step, m, p, b)));
  const size_t n = seqs.size();
  if (n > 3) seqs.resize(3);
  log_info("step ", step + 1, "/", cfg_.train.steps,
           ": the global batch has no labelled token (every target has loss weight 0 or is masked): no update",
           no_label_described_ == 1 ? " (weights, Adam moments and Adam's step count unchanged; the step counts "
                                      "toward train.steps and the learning-rate schedule)"
                                    : "",
           "; its sequences: ", join(seqs, "; "), n > 3 ? "; and " + std::to_string(n - 3) + " more" : "");
}

void Trainer::save_hf(const std::string& dir) const {
  if (model_->layout().lora().enabled()) return save_lora_export(dir);    // (a PEFT adapter folder)
  std::vector<std::vector<float>> units = store_->master_host_at_root();  // (ZeRO-3: collective)
  if (world_.rank() != 0 && cfg_.parallel.zero.stage == 3) return;
  std::vector<ops::Tensor> views;
  for (std::vector<float>& u : units)
    views.emplace_back(u.data(), DType::F32, std::initializer_list<int64_t>{static_cast<int64_t>(u.size())});
  ckpt::save_hf_model(dir, model_->config(), model_->layout(), views,
                      cfg_.output.hf_dtype == "bf16" ? ckpt::StDType::BF16 : ckpt::StDType::F32);
  const std::string tok = ckpt::export_tokenizer_files(cfg_.data.path, dir);  // for AutoTokenizer
  if (!tok.empty()) log_info("tokenizer: ", tok);
}

int run_stage(dist::Runtime& rt, const StageConfig& cfg, dist::ProcessGroups& groups, const RunOptions& opts) {
  dist::install_stop_signals();
  LogOptions lo;
  lo.rank = rt.rank();
  const std::string& lv = cfg.logging.level;
  lo.level = lv == "debug"   ? LogLevel::Debug
             : lv == "warn"  ? LogLevel::Warn
             : lv == "error" ? LogLevel::Error
                             : LogLevel::Info;
  if (cfg.logging.per_rank) {
    fs::create_directories(fs::path(cfg.output.dir) / "logs");
    lo.per_rank_file = (fs::path(cfg.output.dir) / "logs" / ("rank" + std::to_string(rt.rank()) + ".log")).string();
  }
  log_init(lo);
  Trainer t(cfg, groups, opts);
  t.run();
  return t.stopped() ? dist::stop_exit_code(dist::agreed_stop().signal) : 0;  // 130 after Ctrl-C
}

}  // namespace easyctx::train
