// Per-op time of a backend (`logging.profile: true`): ProfilingBackend forwards every op to
// the backend it wraps and brackets the timed ones with the inner backend's OpTimer (CUDA:
// a pair of events on the backend's stream, so the device time of the op's kernels, not the
// host's launch time; CPU: the wall clock around the synchronous call). Ops are keyed by
// name and shape ("matmul NT 32768x2048x2048 ->f32 +C", "attention_bwd causal 65536x65536
// 32/4x64"), attention keys also by the route the wrapped backend takes where it has several
// (Backend::attention_route; CUDA: "attention_bwd causal 65536x65536 32/4x64 [cudnn tiles]");
// each key keeps calls, milliseconds and model FLOPs (matmuls 2MNK, attention by the (query,
// key) pairs its mask leaves visible, the backward 2.5x the forward), so the report gives
// achieved TFLOP/s per shape. Copies on the backend's copy stream and
// collectives (which run on the communicator's stream) are not ops of the interface and are
// not timed here; the trainer times its phases around them (Trainer::run).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ops/ops.h"

namespace easyctx::ops {

// One op's totals over the profiled steps.
struct OpProfileRow {
  std::string key;
  int64_t calls = 0;
  double ms = 0;     // device (or wall) milliseconds, summed
  double flops = 0;  // model FLOPs, summed (0: not counted for this op)
};

class ProfilingBackend final : public Backend {
 public:
  explicit ProfilingBackend(std::unique_ptr<Backend> inner);
  ~ProfilingBackend() override;

  Backend& base() override { return inner_->base(); }
  // Timing on or off (the trainer leaves the warm-up step out); off costs nothing.
  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  // Waits for the timed work and folds it into the totals; call at the end of each timed
  // step (it synchronizes the backend).
  void collect();
  // Totals so far, largest time first.
  std::vector<OpProfileRow> rows() const;
  // Sum of rows()' ms.
  double total_ms() const;

  const char* name() const override { return inner_->name(); }
  MemSpace memspace() const override { return inner_->memspace(); }
  Buffer allocate(DType t, int64_t numel, const char* what) override { return inner_->alloc(t, numel, what); }
  void synchronize() override { inner_->synchronize(); }
  MemoryStats memory_stats() const override { return inner_->memory_stats(); }
  void reset_peak_memory() override { inner_->reset_peak_memory(); }
  Buffer allocate_host_pinned(DType t, int64_t numel, const char* what) override {
    return inner_->alloc_host_pinned(t, numel, what);
  }
  CopyFence copy_async(const Tensor& dst, const Tensor& src) override { return inner_->copy_async(dst, src); }
  void wait_copy(CopyFence f) override { inner_->wait_copy(f); }
  void copy_on(Queue& q, const Tensor& dst, const Tensor& src) override { inner_->copy_on(q, dst, src); }
  Queue& queue() override { return inner_->queue(); }
  void bind_thread() override { inner_->bind_thread(); }
  std::unique_ptr<Queue> make_queue(bool high_priority) override { return inner_->make_queue(high_priority); }
  std::unique_ptr<OpTimer> make_op_timer() override { return inner_->make_op_timer(); }
  std::string attention_route(const AttentionCall& call, bool backward) const override {
    return inner_->attention_route(call, backward);
  }

  void copy(const Tensor& dst, const Tensor& src) override;
  void copy_2d(const Tensor& dst, int64_t dst_pitch, const Tensor& src, int64_t src_pitch, int64_t rows,
               int64_t width) override;
  void fill(const Tensor& x, double value) override;
  void axpy(const Tensor& y, const Tensor& x, double alpha) override;
  void scale(const Tensor& x, double alpha) override;
  double sum_squares(const Tensor& x) override;
  void embedding_fwd(const Tensor& ids, const Tensor& table, const Tensor& out) override;
  void embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dtable) override;
  void rmsnorm_fwd(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd) override;
  void rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                   const Tensor& dw) override;
  void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, double alpha,
              double beta) override;
  void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, bool inverse) override;
  void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionBlock& blk, const Tensor& o,
                     const Tensor& lse) override;
  void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                     const Tensor& dout, const AttentionBlock& blk, const Tensor& dq, const Tensor& dk,
                     const Tensor& dv) override;
  void attention_merge(const Tensor& o, const Tensor& lse, const Tensor& o_blk, const Tensor& lse_blk) override;
  void swiglu_fwd(const Tensor& g, const Tensor& u, const Tensor& h) override;
  void swiglu_bwd(const Tensor& g, const Tensor& u, const Tensor& dh, const Tensor& dg, const Tensor& du) override;
  LossSums lm_head_loss(const Tensor& x, const Tensor& w, const Tensor& labels, int64_t tile_tokens, double grad_scale,
                        const Tensor& dx, const Tensor& dw) override;
  void lm_head_score(const Tensor& x, const Tensor& w, const Tensor& labels, int64_t tile_tokens, const Tensor& nll,
                     const Tensor& top) override;
  void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWStep& s) override;

 private:
  // Runs f between the timer's marks under `key` when enabled.
  template <typename F>
  auto timed(const char* key_prefix, const std::string& detail, double flops, F&& f);

  std::unique_ptr<Backend> inner_;
  std::unique_ptr<OpTimer> timer_;
  bool enabled_ = false;
  std::vector<std::pair<int64_t, double>> pending_;  // (key index, flops) per mark, in order
  std::vector<OpProfileRow> totals_;
  std::map<std::string, int64_t> index_;
};

// Visible (query, key) pairs of one attention block (the mask's count; batch and heads not included).
double attention_pairs(int64_t sq, int64_t sk, const AttentionBlock& blk);

}  // namespace easyctx::ops
