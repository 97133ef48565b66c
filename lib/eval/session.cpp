// The evaluation session (session.h): the model loaded once on every rank, forward-only
// passes through LlamaModel::forward_score, sequence parallelism inside a group of
// consecutive ranks, data parallelism over items across the groups.
//
// One score_spans call:
//  1. Every rank orders the requests longest first (ties by index) and cuts them into
//     rounds of dp_size items; item j of a round goes to data-parallel group j. Rounds keep
//     the groups in step (their items have about the same length), so no group waits at the
//     round's exchange for long, and progress is known after each round.
//  2. A group scores its item: the tokens are laid out over its ranks as the training loader
//     does (data::sp_slice: the mode's layout, padded at the end to the split's multiple
//     with positions L..Lp-1 and no labels: causal attention keeps real tokens from seeing
//     the pad, and the caller's tokens are never changed). A row is labelled (the next
//     token) iff its position is in some span; forward_score returns each labelled row's NLL
//     and argmax flag, computed only on those rows.
//  3. The group's ranks put their rows' values at their positions' places in one array over
//     the distinct scored positions and sum it over the group (host MPI): every place has one
//     owner, so the sum is exact and every rank holds every scored position's values. Each
//     span is then summed in position order (the same order whatever the layout or size).
//  4. The round's spans are summed over the world (only sp rank 0 of the owning group
//     contributes, exact again), so every rank returns every score.
#include "eval/session.h"

#include "core/cli_alias.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "attention/strategy.h"
#include "core/error.h"
#include "core/log.h"
#include "core/strings.h"
#include "data/sp_slice.h"
#include "dist/comm_mpi.h"
#include "dist/groups.h"
#include "dist/runtime.h"
#include "eval/model_source.h"
#include "model/llama.h"
#include "ops/backend_factory.h"

namespace easyctx::eval {
namespace {

using ops::DType;
using ops::Tensor;

void check_options(const SessionOptions& o, int world) {
  EASYCTX_CHECK_INPUT(!o.model.empty(), "--model: required (a Hugging Face folder or ckpt:DIR)");
  EASYCTX_CHECK_INPUT(o.sp_size >= 1, "--sp-size: ", o.sp_size, " (must be >= 1)");
  EASYCTX_CHECK_INPUT(world % o.sp_size == 0, "--sp-size: ", o.sp_size, " does not divide the ", world,
                      " rank(s) of the job (ranks = data-parallel groups x --sp-size)");
  EASYCTX_CHECK_INPUT(o.sp_size == 1 || o.sp_mode != SeqParallelMode::None, "--sp-mode: none with --sp-size ",
                      o.sp_size);
  EASYCTX_CHECK_INPUT(o.ulysses_size >= 0, "--ulysses-size: ", o.ulysses_size, " (must be >= 0)");
  EASYCTX_CHECK_INPUT(o.attention_head_groups >= 1, "--attention-head-groups: ", o.attention_head_groups,
                      " (must be >= 1)");
  EASYCTX_CHECK_INPUT(o.mlp_tile >= 0, "--mlp-tile: ", o.mlp_tile, " (must be >= 0; 0: untiled)");
  EASYCTX_CHECK_INPUT(o.lm_head_tile >= 1, "--lm-head-tile: ", o.lm_head_tile, " (must be >= 1)");
  EASYCTX_CHECK_INPUT(o.rope_theta >= 0, "--rope-theta: ", o.rope_theta, " (must be >= 0; 0: the model's)");
  EASYCTX_CHECK_INPUT(o.collective_timeout_s > 0, "collective timeout: ", o.collective_timeout_s, " s (must be > 0)");
}

}  // namespace

void validate_session_options(const SessionOptions& o, int world_size) { check_options(o, world_size); }

DeviceKind parse_device(const std::string& v, const std::string& flag) {
  for (DeviceKind d : {DeviceKind::Auto, DeviceKind::Cpu, DeviceKind::Cuda})
    if (v == to_string(d)) return d;
  EASYCTX_THROW_INPUT(flag, ": bad value '", v, "': expected auto, cpu or cuda");
}

SeqParallelMode parse_sp_mode(const std::string& v, const std::string& flag) {
  // EasyContext's names (zigzag_ring_attn, ...) as well as easyctx's.
  const std::string name = canonical_sp_mode_name(v);
  for (SeqParallelMode m : {SeqParallelMode::ZigzagRing, SeqParallelMode::Ulysses, SeqParallelMode::DistFlash,
                            SeqParallelMode::Usp, SeqParallelMode::None})
    if (name == to_string(m)) return m;
  EASYCTX_THROW_INPUT(flag, ": bad value '", v,
                      "': expected zigzag_ring, ulysses, dist_flash, usp or none "
                      "(EasyContext's zigzag_ring_attn, ulysses_attn, dist_flash_attn, usp_attn, data_parallel)");
}

StageConfig session_config(const SessionOptions& o) {
  StageConfig c;
  c.source = "evaluation flags (--sp-size, --sp-mode, --ulysses-size)";
  c.parallel.sequence.mode = o.sp_size > 1 ? o.sp_mode : SeqParallelMode::ZigzagRing;
  c.parallel.sequence.size = o.sp_size;
  c.parallel.sequence.ulysses_size = o.sp_mode == SeqParallelMode::Usp ? o.ulysses_size : 0;
  c.parallel.collective_timeout_s = o.collective_timeout_s;
  c.activation.attention_head_groups = o.attention_head_groups;
  c.activation.mlp_tile = o.mlp_tile;
  c.activation.lm_head_tile = o.lm_head_tile;
  c.activation.checkpoint = CheckpointPolicy::None;
  return c;
}

namespace {

class EvalSession final : public Session {
 public:
  EvalSession(const SessionOptions& o, dist::Comm& world) : o_(o), world_(world) {
    auto* mpi = dynamic_cast<dist::MpiComm*>(&world);
    EASYCTX_CHECK(mpi != nullptr, "open_session: the world communicator must be an MPI (host) one, got '",
                  world.backend(), "'");
    check_options(o, world.size());
    // The model first: resolving a checkpoint here is collective, and every rank must reach it
    // (the checks above give the same answer on every rank).
    if (o.resolved) {
      EASYCTX_CHECK(o.resolved->spec == o.model, "open_session: SessionOptions::resolved is '", o.resolved->spec,
                    "', the model is '", o.model, "'");
      ref_ = *o.resolved;
    } else {
      ref_ = resolve_model(o.model, mpi->mpi_comm(), o.collective_timeout_s);
    }
    device_ = ops::resolve_device(o.device, "--device");
    cfg_ = model_config(ref_, o.rope_theta);
    session_cfg_ = session_config(o);
    // Ranks per node among the world's ranks (usp's default Ulysses degree).
    MPI_Comm node;
    dist::check_mpi(MPI_Comm_split_type(mpi->mpi_comm(), MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL, &node),
                    "MPI_Comm_split_type");
    int local_size = 1;
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
    layout_ = dist::make_group_layout(session_cfg_, world.size(), local_size);
    split_ = attention::sequence_split(layout_);
    if (o.sp_size > 1 && (o.sp_mode == SeqParallelMode::Ulysses || o.sp_mode == SeqParallelMode::Usp)) {
      const int u = layout_.ulysses_size;
      EASYCTX_CHECK_INPUT(cfg_.num_heads % u == 0, "--sp-size/--sp-mode: the Ulysses degree ", u,
                          " must divide the model's attention heads (", cfg_.num_heads, ")");
    }
    EASYCTX_CHECK_INPUT(cfg_.num_kv_heads % o.attention_head_groups == 0,
                        "--attention-head-groups: ", o.attention_head_groups,
                        " does not divide the model's key/value heads (", cfg_.num_kv_heads, ")");
    groups_ = std::make_unique<dist::ProcessGroups>(mpi->mpi_comm(), layout_, dist::choose_backend(device_),
                                                    o.collective_timeout_s);
    // Results travel over host MPI whatever the compute communicators are.
    const int rank = world.rank();
    dist::check_mpi(MPI_Comm_split(mpi->mpi_comm(), layout_.dp_rank(rank), layout_.sp_rank(rank), &sp_mpi_),
                    "MPI_Comm_split");
    sp_host_ = dist::make_comm(sp_mpi_, "sp (results)", dist::CommBackend::Mpi, o.collective_timeout_s);
    be_ = ops::make_backend(device_);
    dtype_ = be_->memspace() == MemSpace::Device ? DType::BF16 : DType::F32;
    model::ModelOptions mo;
    mo.checkpoint = CheckpointPolicy::None;
    mo.mlp_tile = o.mlp_tile;
    mo.lm_head_tile = o.lm_head_tile;
    model_ = std::make_unique<model::LlamaModel>(cfg_, *be_, dtype_, mo,
                                                 attention::make_sequence_attention(session_cfg_, *groups_, *be_));
    weights_ = load_model_weights(ref_, model_->layout(), *be_, dtype_);
    for (const ops::Buffer& b : weights_) {
      params_.push_back(b.flat());
      stats_.weight_bytes += static_cast<int64_t>(b.bytes());
    }
    device_name_ = ops::device_info(*be_).name;
  }

  ~EvalSession() override {
    model_.reset();
    weights_.clear();
    sp_host_.reset();
    groups_.reset();
    if (sp_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&sp_mpi_);
  }

  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t bos_id() const override { return cfg_.bos_token_id; }

  std::string describe() const override {
    std::string s = (device_ == DeviceKind::Cuda ? device_name_ + " (bf16)" : std::string("cpu (f32)")) + ", " +
                    std::to_string(layout_.world_size) + " rank(s) = " + std::to_string(layout_.dp_size) +
                    " data-parallel x " + std::to_string(layout_.sp_size) + " sequence-parallel";
    if (layout_.sp_size > 1) s += std::string(" (") + to_string(layout_.mode) + ")";
    if (o_.attention_head_groups > 1)
      s += ", attention in " + std::to_string(o_.attention_head_groups) + " head groups";
    return s + "; " + ref_.spec + ": " + cfg_.describe();
  }

  SessionStats stats() const override {
    SessionStats s = stats_;
    s.alloc_peak_bytes = be_->memory_stats().peak_bytes;
    return s;
  }

  std::vector<std::vector<SpanScore>> score_spans(const std::vector<ScoreRequest>& requests) override {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t n_req = static_cast<int64_t>(requests.size());
    int64_t tokens_total = 0;
    for (int64_t i = 0; i < n_req; ++i) {
      check_request(requests[static_cast<size_t>(i)], i);
      tokens_total += static_cast<int64_t>(requests[static_cast<size_t>(i)].tokens.size());
    }
    std::vector<std::vector<SpanScore>> out(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) out[i].resize(requests[i].spans.size());
    std::vector<int64_t> order(requests.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return requests[static_cast<size_t>(a)].tokens.size() > requests[static_cast<size_t>(b)].tokens.size();
    });
    const int64_t dp = layout_.dp_size, me = layout_.dp_rank(world_.rank());
    const bool reporter = layout_.sp_rank(world_.rank()) == 0;
    ScoreProgress prog;
    prog.items_total = n_req;
    prog.tokens_total = tokens_total;
    for (int64_t r0 = 0; r0 < n_req; r0 += dp) {
      const int64_t r1 = std::min(n_req, r0 + dp);
      // This round's spans, item after item: sum, count, argmax misses (summed over the world).
      std::vector<int64_t> base(static_cast<size_t>(r1 - r0) + 1, 0);
      for (int64_t j = r0; j < r1; ++j)
        base[static_cast<size_t>(j - r0 + 1)] =
            base[static_cast<size_t>(j - r0)] +
            static_cast<int64_t>(requests[static_cast<size_t>(order[j])].spans.size());
      std::vector<double> vals(static_cast<size_t>(3 * base.back()), 0.0);
      if (r0 + me < r1) {
        const int64_t item = order[static_cast<size_t>(r0 + me)];
        const std::vector<SpanScore> sc = score_one(requests[static_cast<size_t>(item)]);
        if (reporter)
          for (size_t s = 0; s < sc.size(); ++s) {
            double* v = vals.data() + 3 * (base[static_cast<size_t>(me)] + static_cast<int64_t>(s));
            v[0] = sc[s].sum_nll;
            v[1] = static_cast<double>(sc[s].count);
            v[2] = sc[s].all_argmax ? 0.0 : 1.0;
          }
      }
      if (world_.size() > 1 && !vals.empty()) world_.all_reduce(vals.data(), vals.size(), dist::ReduceOp::Sum);
      for (int64_t j = r0; j < r1; ++j) {
        const int64_t item = order[static_cast<size_t>(j)];
        std::vector<SpanScore>& dst = out[static_cast<size_t>(item)];
        for (size_t s = 0; s < dst.size(); ++s) {
          const double* v = vals.data() + 3 * (base[static_cast<size_t>(j - r0)] + static_cast<int64_t>(s));
          dst[s].sum_nll = v[0];
          dst[s].count = static_cast<int64_t>(std::llround(v[1]));
          dst[s].all_argmax = v[2] == 0.0;
        }
        prog.items_done += 1;
        prog.tokens_done += static_cast<int64_t>(requests[static_cast<size_t>(item)].tokens.size());
      }
      prog.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (o_.progress) o_.progress(prog);
    }
    stats_.items += n_req;
    stats_.tokens += tokens_total;
    stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }

 private:
  void check_request(const ScoreRequest& r, int64_t i) const {
    const int64_t L = static_cast<int64_t>(r.tokens.size());
    for (int64_t t = 0; t < L; ++t) {
      const int32_t id = r.tokens[static_cast<size_t>(t)];
      EASYCTX_CHECK_INPUT(id >= 0 && id < cfg_.vocab_size, "score_spans: request ", i, ": token ", id, " at ", t,
                          " is outside the model's vocabulary [0, ", cfg_.vocab_size, ")");
    }
    for (size_t s = 0; s < r.spans.size(); ++s) {
      const ScoreRequest::Span& sp = r.spans[s];
      EASYCTX_CHECK_INPUT(sp.length == 0 || (sp.begin >= 0 && sp.length > 0 && sp.begin + sp.length <= L - 1),
                          "score_spans: request ", i, " span ", s, ": [", sp.begin, ", ", sp.begin + sp.length,
                          ") must lie in [0, ", L - 1, ") (the prediction at p is scored against token p + 1 of ", L,
                          ")");
    }
  }

  // One item on this rank's sequence-parallel group; every rank of the group returns the same.
  std::vector<SpanScore> score_one(const ScoreRequest& r) {
    const int64_t L = static_cast<int64_t>(r.tokens.size());
    std::vector<SpanScore> res(r.spans.size());
    // The distinct scored positions, in order, and each one's place.
    std::vector<int64_t> place(static_cast<size_t>(std::max<int64_t>(L, 0)), -1);
    for (const ScoreRequest::Span& s : r.spans)
      for (int64_t p = s.begin; p < s.begin + s.length; ++p) place[static_cast<size_t>(p)] = 0;
    int64_t U = 0;
    for (int64_t& pl : place)
      if (pl == 0) pl = U++;
    for (SpanScore& s : res) s.all_argmax = true;
    if (U == 0) return res;  // nothing to score: no forward (the same on every rank of the group)

    const int sp = layout_.sp_size, sp_rank = layout_.sp_rank(world_.rank());
    std::vector<uint32_t> window(static_cast<size_t>(L) + 1, 0);
    for (int64_t t = 0; t < L; ++t)
      window[static_cast<size_t>(t)] = static_cast<uint32_t>(r.tokens[static_cast<size_t>(t)]);
    data::SpSlice slice = data::sp_slice(window.data(), L, split_.layout, sp, sp_rank, 0, split_.inner);
    const int64_t n = static_cast<int64_t>(slice.tokens.size());
    for (int64_t i = 0; i < n; ++i) {  // labels: only the scored positions
      const int64_t p = slice.positions[static_cast<size_t>(i)];
      const bool scored = p < L && place[static_cast<size_t>(p)] >= 0;
      slice.labels[static_cast<size_t>(i)] = scored ? r.tokens[static_cast<size_t>(p) + 1] : -1;
    }
    ensure_batch(n);
    be_->copy(tok_.view({n}), Tensor(slice.tokens.data(), DType::I32, {n}));
    be_->copy(pos_.view({n}), Tensor(slice.positions.data(), DType::I32, {n}));
    be_->copy(lab_.view({n}), Tensor(slice.labels.data(), DType::I32, {n}));
    std::vector<double> nll(static_cast<size_t>(n));
    std::vector<int32_t> top(static_cast<size_t>(n));
    model::Batch b{tok_.view({n}), pos_.view({n}), lab_.view({n}), 1, n};
    b.rope_length = L;  // dynamic RoPE: the item's own length (positions 0..L-1), whatever its layout
    model_->forward_score(params_, b, Tensor(nll.data(), DType::F64, {n}), Tensor(top.data(), DType::I32, {n}));
    be_->synchronize();
    if (device_ == DeviceKind::Cuda)
      stats_.device_used_bytes = std::max(stats_.device_used_bytes, ops::device_memory_used(*be_));
    // Values by place (NLL, then argmax hits), summed over the group: one owner per place.
    std::vector<double> v(static_cast<size_t>(2 * U), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      if (slice.labels[static_cast<size_t>(i)] < 0) continue;
      const int64_t pl = place[static_cast<size_t>(slice.positions[static_cast<size_t>(i)])];
      v[static_cast<size_t>(pl)] = nll[static_cast<size_t>(i)];
      v[static_cast<size_t>(U + pl)] = top[static_cast<size_t>(i)];
    }
    if (sp > 1) sp_host_->all_reduce(v.data(), v.size(), dist::ReduceOp::Sum);
    for (size_t s = 0; s < r.spans.size(); ++s) {
      const ScoreRequest::Span& sp_ = r.spans[s];
      for (int64_t p = sp_.begin; p < sp_.begin + sp_.length; ++p) {
        const int64_t pl = place[static_cast<size_t>(p)];
        res[s].sum_nll += v[static_cast<size_t>(pl)];
        res[s].all_argmax = res[s].all_argmax && v[static_cast<size_t>(U + pl)] == 1.0;
      }
      res[s].count = sp_.length;
    }
    return res;
  }

  // The batch arrays on the backend, grown to the longest slice seen.
  void ensure_batch(int64_t n) {
    if (tok_.numel() >= n) return;
    tok_ = ops::Buffer();
    pos_ = ops::Buffer();
    lab_ = ops::Buffer();
    tok_ = be_->alloc(DType::I32, n, "batch tokens");
    pos_ = be_->alloc(DType::I32, n, "batch positions");
    lab_ = be_->alloc(DType::I32, n, "batch labels");
  }

  SessionOptions o_;
  dist::Comm& world_;
  DeviceKind device_ = DeviceKind::Cpu;
  ModelRef ref_;
  model::LlamaConfig cfg_;
  StageConfig session_cfg_;  // session_config(): parallelism and memory knobs
  dist::GroupLayout layout_;
  attention::SequenceSplit split_;
  std::unique_ptr<dist::ProcessGroups> groups_;
  MPI_Comm sp_mpi_ = MPI_COMM_NULL;
  std::unique_ptr<dist::Comm> sp_host_;
  std::unique_ptr<ops::Backend> be_;
  DType dtype_ = DType::F32;
  std::unique_ptr<model::LlamaModel> model_;
  std::vector<ops::Buffer> weights_;
  std::vector<Tensor> params_;
  ops::Buffer tok_, pos_, lab_;
  std::string device_name_;
  SessionStats stats_;
};

}  // namespace

std::string format_progress(const ScoreProgress& p) {
  const double rate = p.elapsed_s > 0 ? static_cast<double>(p.tokens_done) / p.elapsed_s : 0;
  const double eta = rate > 0 ? static_cast<double>(p.tokens_total - p.tokens_done) / rate : -1;
  return detail::concat(
      "items ", p.items_done, "/", p.items_total, ", ", format_count(static_cast<double>(p.tokens_done)), "/",
      format_count(static_cast<double>(p.tokens_total)), " tokens, ", format_count(rate), " tok/s, elapsed ",
      format_duration(p.elapsed_s),
      p.items_done < p.items_total ? ", ETA " + (eta >= 0 ? format_duration(eta) : std::string("?")) : std::string());
}

std::function<void(const ScoreProgress&)> log_progress(const std::string& what, int rank, double every_s) {
  auto last = std::make_shared<double>(-1e300);
  return [what, rank, every_s, last](const ScoreProgress& p) {
    if (rank != 0) return;
    if (p.items_done < p.items_total && p.elapsed_s - *last < every_s) return;
    *last = p.elapsed_s;
    log_info(what, what.empty() ? "" : ": ", format_progress(p));
  };
}

std::unique_ptr<Session> open_session(const SessionOptions& o, dist::Comm& world) {
  return std::make_unique<EvalSession>(o, world);
}

}  // namespace easyctx::eval
