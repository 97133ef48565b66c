// What a training run tells its user (docs/design.md step 6): the startup lines, one log line and
// one metrics.jsonl record per step (loss, lr, grad norm, tokens/s, MFU, memory, ETA), the
// per-op profile of logging.profile with the step's phases, and the memory plan beside the
// measured peaks at the end. Rank 0 writes; every rank computes its MFU and memory.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/metrics.h"
#include "core/tensorboard.h"
#include "ops/ops.h"

namespace easyctx::ops {
class ProfilingBackend;
}

namespace easyctx::train {

struct StepStats {
  int64_t step = 0;  // 0-based step index
  double loss = 0;   // mean NLL over the global batch's labelled tokens
  double lr = 0;
  double grad_norm = 0;        // global L2 norm before clipping
  int64_t tokens = 0;          // input tokens of the global batch
  int64_t labels = 0;          // labelled tokens of the global batch
  double seconds = 0;          // wall time of the step
  double fwd_bwd_seconds = 0;  // of it: data, forward and backward (gradients final), before clip and optimizer
  double mfu = -1;             // model FLOP utilisation (CUDA with a known peak; else -1), set by run()
  // Query-key pairs attended over a causal square's (the global batch's sequences): below 1
  // under data.document_mask or a sliding window; MFU counts the attention FLOPs done.
  double attention_share = 1;
  double peak_mem_gib = -1;  // device memory high-water mark so far (CUDA; else -1), set by run()
  // parallel.zero.offload_optimizer (else -1): the host AdamW's wall seconds that completed in
  // this step (a deferred update in the step whose forward it finished in; the run's last step
  // also its own), of it the seconds this step's thread waited for it (exposed: an upper bound
  // of the GPU's idle time, which may still run kernels queued before the wait), and the
  // update's GB/s (30 bytes an element over its wall time; 0 when none completed).
  double host_optimizer_s = -1;
  double host_optimizer_exposed_s = -1;
  double host_optimizer_gb_s = -1;
  bool skipped = false;  // non-finite loss or gradient norm with train.on_nonfinite: skip_step: no update
  // No labelled token in the whole global batch (every target weighted 0 or masked): no loss,
  // no gradient, no update; loss and grad_norm mean nothing (metrics.jsonl leaves them out).
  bool no_labels = false;
};

class StepReporter {
 public:
  // be: the run's backend (behind ops::ProfilingBackend with logging.profile); world_size:
  // ranks sharing the global batch's tokens; root: this rank writes.
  // flops_per_token: the model's training FLOPs per token with a full causal square of
  // attention, attention_flops_per_token of them (scaled by StepStats::attention_share).
  StepReporter(const StageConfig& cfg, ops::Backend& be, int world_size, bool root, double flops_per_token,
               double attention_flops_per_token);
  ~StepReporter();

  // The device and its peak (CUDA), once.
  void log_device() const;
  // metrics.jsonl (rank 0, logging.metrics): a resumed run keeps the records before start_step.
  // TensorBoard (rank 0, logging.tensorboard): a new event file in <output.dir>/tensorboard/;
  // a resumed run's (and one that starts over in a folder holding event files of the same run)
  // starts with a SessionLog START at its first step, so that TensorBoard drops what an earlier,
  // killed process logged from there on (metrics.jsonl drops those records too).
  void open_metrics(int64_t start_step);

  // logging.profile: step `step` is timed unless it is the run's first (cuDNN plans,
  // allocations) and there are others; phase(name) ends a phase of it (synchronizing the
  // backend); end_step folds the timed ops in.
  void begin_step(int64_t step, int64_t start_step);
  void phase(const char* name);
  bool profiling() const;
  void end_step(const StepStats& st);

  // After step `step` (0-based) of a run that started at `start_step`, `elapsed` seconds in:
  // MFU and memory into st, the metrics record, the log line every logging.every steps. The
  // TensorBoard event of the step holds every number of the metrics record ("step" is the
  // event's step) as train/<key>, the float32 of the record's value; skipped and no_labels as 1.
  // A step with no labelled token has no loss or grad_norm in either, and "no_labels": true.
  void record(int64_t step, int64_t start_step, double elapsed, StepStats& st);
  // The profile of the timed steps (rank 0), also written to <output.dir>/profile.json.
  void report_profile() const;
  // The device-memory high-water mark sampled after each step (cudaMemGetInfo; -1 on the CPU).
  double peak_device_bytes() const { return peak_mem_bytes_; }

 private:
  using Clock = std::chrono::steady_clock;
  const StageConfig& cfg_;
  ops::Backend& be_;
  int world_size_;
  bool root_;
  double flops_per_token_;
  double attention_flops_per_token_;
  double peak_flops_ = 0;  // the device's dense bf16 peak, FLOP/s (0: unknown)
  double peak_mem_bytes_ = -1;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<tb::EventWriter> tb_;
  ops::ProfilingBackend* prof_ = nullptr;                 // (null without logging.profile)
  std::vector<std::pair<std::string, double>> phase_ms_;  // per phase, in order: ms summed over profiled steps
  Clock::time_point phase_t_;
  int64_t profiled_steps_ = 0;
  double profiled_ms_ = 0;  // wall time of the profiled steps
};

}  // namespace easyctx::train
