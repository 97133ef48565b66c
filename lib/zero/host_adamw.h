// AdamW on the host for parameters whose fp32 master weights and Adam moments live in host
// memory (parallel.zero.offload_optimizer): the fp32 gradients stream from the device in
// chunks through pinned staging, AdamW runs on the host's threads (kernels/adamw_math.h: the
// same float operations as the GPU's AdamW kernel, so the weights are bit-identical to an
// on-GPU optimizer's), and the updated weights stream back as bf16. The copies of chunk i+1
// (down) and i-1 (up) overlap the host update of chunk i, on two queues of the backend beside
// its compute queue (ops::Backend::make_queue, copy_on): on CUDA two streams; on the CPU
// backend every copy is done when issued.
//
// start() runs the step on a host thread and returns at once: the next forward waits for each
// unit only as it reaches it (wait_unit: the host until the unit's update and upload are
// issued, then the caller's queues on the returned fence), so the update of the later units
// overlaps the forward of the earlier ones. finish() joins the thread.
// A piece whose bf16 weights live in host memory (work_host: ZeRO-3 with offload_params) gets
// them written there by the update itself (no upload; its unit's fence then marks nothing).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/fence.h"
#include "ops/ops.h"

namespace easyctx::zero {

struct OffloadPiece {
  float* master = nullptr;           // host f32[n]
  float* m = nullptr;                // host f32[n]
  float* v = nullptr;                // host f32[n]
  const float* grad_dev = nullptr;   // backend f32[n], streamed down through the staging, or
  const float* grad_host = nullptr;  // host f32[n] instead (parallel.zero.offload_grads): read in place
  void* work_dev = nullptr;          // backend bf16[n]: receives the updated weights (uploaded), or
  uint16_t* work_host = nullptr;     // host bf16[n] instead (parallel.zero.offload_params): written in place
  int64_t n = 0;
  double weight_decay = 0;
  size_t unit = 0;  // the parameter unit it belongs to (wait_unit); pieces come unit by unit
};

// What the host AdamW took since it was last asked (HostAdamW::take_times).
struct HostAdamWTimes {
  int64_t steps = 0;     // host updates completed
  int64_t elements = 0;  // elements they updated
  double seconds = 0;    // their wall time on the update's thread (copies and update)
  double waited = 0;     // the caller's thread blocked on them (wait_unit, finish): the exposed part
  // GB/s of the update's own memory traffic (30 bytes an element: master, m, v, gradient read;
  // master, m, v and the bf16 copy written), 0 without a step.
  double gb_per_s() const { return seconds > 0 ? 30.0 * static_cast<double>(elements) / seconds / 1e9 : 0.0; }
};

class HostAdamW {
 public:
  // chunk_elems: elements per pinned staging slot (two slots of f32 + bf16), from `be`.
  HostAdamW(ops::Backend& be, int64_t chunk_elems);
  ~HostAdamW();
  HostAdamW(const HostAdamW&) = delete;
  HostAdamW& operator=(const HostAdamW&) = delete;

  // One optimizer step over every piece (s.weight_decay is taken from each piece). The
  // gradients must be final (the caller has synchronised the backend); returns when the
  // weights are updated. = start() + finish().
  void step(const std::vector<OffloadPiece>& pieces, const ops::AdamWStep& s);
  // The same step on a host thread (the update on `threads` OpenMP threads); returns at once.
  // Until finish(), the pieces' gradients must not be written nor their weights read, except
  // per unit after wait_unit.
  void start(std::vector<OffloadPiece> pieces, const ops::AdamWStep& s, int threads);
  // Blocks until unit u's update and upload are issued; returns the fence after which its
  // device weights are updated (its gradients are no longer read then). Rethrows an error of
  // the step. A unit without pieces, or no step running, returns a complete fence at once.
  Fence wait_unit(size_t u);
  // Joins the step's thread and waits for its copies (no-op when none runs); rethrows its
  // error. Idempotent.
  void finish();
  bool pending() const;
  // Seconds of the last step (host update and copies, on its thread).
  double last_seconds() const { return last_seconds_; }
  int64_t pinned_bytes() const;
  // The completed steps' times and the caller's waits since the last call; resets them.
  HostAdamWTimes take_times();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  double last_seconds_ = 0;
  int64_t last_elements_ = 0;  // (of the running or last step)
  HostAdamWTimes times_;
};

// f32 -> bf16 bits of n values (ops::float_to_bf16: round to nearest even, as the GPU's
// conversion), on the host's threads.
void f32_to_bf16(const float* src, uint16_t* dst, int64_t n);

}  // namespace easyctx::zero
