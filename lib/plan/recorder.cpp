#include "plan/recorder.h"

#include <algorithm>

#include "core/checked.h"
#include "core/error.h"
#include "ops/attention_route.h"
#include "ops/scratch.h"

namespace easyctx::plan {

int64_t AllocRecorder::add(const std::string& what, int64_t bytes) {
  const int64_t id = next_++;
  live_[id] = {what.empty() ? "(unnamed buffer)" : what, bytes};
  labels_.insert(live_[id].what);
  live_bytes_ = checked_add(live_bytes_, bytes, "the plan: live bytes after " + what);
  if (live_bytes_ > peak_bytes_) {
    peak_bytes_ = live_bytes_;
    peak_extra_.clear();
    for (const auto& [i, e] : live_)
      if (!at_begin_.count(i)) peak_extra_.push_back(e);
  }
  return id;
}

void AllocRecorder::remove(int64_t id) {
  auto it = live_.find(id);
  EASYCTX_CHECK(it != live_.end(), "AllocRecorder: buffer ", id, " freed twice");
  live_bytes_ -= it->second.bytes;
  live_.erase(it);
}

void AllocRecorder::begin_phase() {
  at_begin_.clear();
  for (const auto& [i, e] : live_) at_begin_[i] = true;
  peak_bytes_ = live_bytes_;
  peak_extra_.clear();
}

std::vector<AllocRecorder::Entry> AllocRecorder::live() const {
  std::vector<Entry> v;
  for (const auto& [i, e] : live_) v.push_back(e);
  return v;
}

namespace {

// Addresses that are never dereferenced: distinct, 256-byte aligned, far from real memory.
void* fake_address(int64_t bytes) {
  static uint64_t next = uint64_t{1} << 46;
  void* p = reinterpret_cast<void*>(next);
  next += (static_cast<uint64_t>(std::max<int64_t>(bytes, 1)) + 255) / 256 * 256;
  return p;
}

class RecordingBackend final : public ops::Backend {
 public:
  RecordingBackend(AllocRecorder& rec, const RecordingOptions& o) : rec_(rec), o_(o) {}
  const char* name() const override { return o_.space == MemSpace::Device ? "cuda (recorded)" : "cpu (recorded)"; }
  MemSpace memspace() const override { return o_.space; }
  ops::MemoryStats memory_stats() const override { return {rec_.live_bytes(), rec_.peak_bytes(), 0}; }
  void reset_peak_memory() override { rec_.begin_phase(); }

  ops::Buffer allocate(DType t, int64_t numel, const char* what) override {
    return record(rec_, t, numel, what, o_.space);
  }
  ops::Buffer allocate_host_pinned(DType t, int64_t numel, const char* what) override {
    return record(o_.pinned ? *o_.pinned : rec_, t, numel, what, MemSpace::Host);
  }
  ops::CopyFence copy_async(const ops::Tensor&, const ops::Tensor&) override { return {}; }
  void wait_copy(ops::CopyFence) override {}
  void copy_on(Queue&, const ops::Tensor&, const ops::Tensor&) override {}
  void copy(const ops::Tensor&, const ops::Tensor&) override {}
  void copy_2d(const ops::Tensor&, int64_t, const ops::Tensor&, int64_t, int64_t, int64_t) override {}
  void fill(const ops::Tensor&, double) override {}
  void axpy(const ops::Tensor&, const ops::Tensor&, double) override {}
  void scale(const ops::Tensor&, double) override {}
  double sum_squares(const ops::Tensor&) override { return 0; }
  void embedding_fwd(const ops::Tensor&, const ops::Tensor&, const ops::Tensor&) override {}
  void embedding_bwd(const ops::Tensor&, const ops::Tensor&, const ops::Tensor&) override {}
  void rmsnorm_fwd(const ops::Tensor&, const ops::Tensor&, double, const ops::Tensor&, const ops::Tensor&) override {}
  void rmsnorm_bwd(const ops::Tensor&, const ops::Tensor&, const ops::Tensor&, const ops::Tensor&, const ops::Tensor&,
                   const ops::Tensor&) override {}
  void matmul(const ops::Tensor&, bool, const ops::Tensor&, bool, const ops::Tensor&, double, double) override {}
  void rope(const ops::Tensor&, const ops::Tensor&, const ops::Tensor&, bool) override {}
  // CUDA: the route's scratch (ops/attention_route.h), live together for the call.
  void attention_fwd(const ops::Tensor& q, const ops::Tensor& k, const ops::Tensor&, const ops::AttentionBlock& blk,
                     const ops::Tensor&, const ops::Tensor&) override {
    if (!o_.cuda_scratch) return;
    const ops::AttentionCall c = ops::attention_call(q, k, blk);
    const ops::AttentionFwdRoute route = ops::attention_fwd_route(c, route_options());
    note_route("forward", c, ops::route_name(route));
    scratch(ops::attention_fwd_scratch(route, c));
  }
  void attention_bwd(const ops::Tensor& q, const ops::Tensor& k, const ops::Tensor&, const ops::Tensor&,
                     const ops::Tensor&, const ops::Tensor&, const ops::AttentionBlock& blk, const ops::Tensor& dq,
                     const ops::Tensor&, const ops::Tensor&) override {
    if (!o_.cuda_scratch) return;
    const ops::AttentionCall c = ops::attention_call(q, k, blk, dq.dtype == DType::F32);
    const ops::AttentionRouteOptions ro = route_options();
    const ops::AttentionBwdRoute route = ops::attention_bwd_route(c, ro);
    note_route("backward", c, ops::route_name(route));
    scratch(ops::attention_bwd_scratch(route, c, ro).list());
  }
  void attention_merge(const ops::Tensor&, const ops::Tensor&, const ops::Tensor&, const ops::Tensor&) override {}
  void swiglu_fwd(const ops::Tensor&, const ops::Tensor&, const ops::Tensor&) override {}
  void swiglu_bwd(const ops::Tensor&, const ops::Tensor&, const ops::Tensor&, const ops::Tensor&,
                  const ops::Tensor&) override {}
  ops::LossSums lm_head_loss(const ops::Tensor&, const ops::Tensor&, const ops::Tensor&, int64_t, double,
                             const ops::Tensor&, const ops::Tensor&) override {
    return {};
  }
  // CUDA: the logits tile and the per-row results, live together for the call.
  void lm_head_score(const ops::Tensor& x, const ops::Tensor& w, const ops::Tensor& labels, int64_t tile_tokens,
                     const ops::Tensor&, const ops::Tensor&) override {
    (void)x;
    if (o_.cuda_scratch) scratch(ops::cuda_lm_head_score_scratch(labels.numel(), w.dim(0), tile_tokens).list());
  }
  void adamw(const ops::Tensor&, const ops::Tensor&, const ops::Tensor&, const ops::Tensor&,
             const ops::AdamWStep&) override {}

 private:
  void note_route(const char* dir, const ops::AttentionCall& c, const char* route) {
    if (!o_.routes) return;
    const char* kind = c.unmasked() ? "full" : c.causal_square() ? "causal" : "partial";
    std::string line = std::string(dir) + " " + kind + " " + std::to_string(c.sq) + "x" + std::to_string(c.sk) + " " +
                       std::to_string(c.hq) + "/" + std::to_string(c.hkv) + "x" + std::to_string(c.hd) +
                       (c.batch > 1 ? " B=" + std::to_string(c.batch) : "") + ": " + route;
    if (std::find(o_.routes->begin(), o_.routes->end(), line) == o_.routes->end()) o_.routes->push_back(line);
  }
  ops::AttentionRouteOptions route_options() const {
    ops::AttentionRouteOptions ro;
    ro.deterministic = o_.deterministic;
    ro.sm90 = o_.sm90;
    return ro;
  }
  void scratch(const std::vector<ops::ScratchBuffer>& bufs) {
    std::vector<int64_t> ids;
    for (const ops::ScratchBuffer& b : bufs) ids.push_back(rec_.add(b.name, b.bytes));
    for (int64_t id : ids) rec_.remove(id);
  }
  static ops::Buffer record(AllocRecorder& rec, DType t, int64_t numel, const char* what, MemSpace space) {
    EASYCTX_CHECK(numel >= 0, "alloc: negative element count ", numel);
    const int64_t bytes = checked_mul(numel, static_cast<int64_t>(ops::element_size(t)),
                                      std::string("the plan: bytes of ") + (what ? what : "a buffer"));
    const int64_t id = rec.add(what ? what : "", bytes);
    return ops::Buffer(fake_address(bytes), static_cast<size_t>(bytes), t, space,
                       [&rec, id](void*) { rec.remove(id); });
  }
  AllocRecorder& rec_;
  RecordingOptions o_;
};

class RecordingComm final : public dist::Comm {
 public:
  RecordingComm(std::string name, int size, int rank, MemSpace space)
      : name_(std::move(name)), size_(size), rank_(rank), space_(space) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  MemSpace memspace() const override { return space_; }
  const char* backend() const override { return space_ == MemSpace::Device ? "nccl" : "mpi"; }
  void all_reduce(const void*, void*, size_t, DType, dist::ReduceOp) override {}
  void reduce_scatter(const void*, void*, size_t, DType, dist::ReduceOp) override {}
  void all_gather(const void*, void*, size_t, DType) override {}
  void broadcast(void*, size_t, DType, int) override {}
  void send_recv(const void*, size_t, int, void*, size_t, int, DType) override {}
  void all_to_all(const void*, void*, size_t, DType) override {}
  void barrier() override {}
  double all_reduce_scalar(double v, dist::ReduceOp) override { return v; }

 private:
  std::string name_;
  int size_, rank_;
  MemSpace space_;
};

}  // namespace

std::unique_ptr<ops::Backend> make_recording_backend(AllocRecorder& rec, const RecordingOptions& o) {
  return std::make_unique<RecordingBackend>(rec, o);
}

std::unique_ptr<dist::Comm> make_recording_comm(const std::string& name, int size, int rank, MemSpace space) {
  return std::make_unique<RecordingComm>(name, size, rank, space);
}

}  // namespace easyctx::plan
