// AdamW on the host for parameters whose fp32 master weights and Adam moments live in host
// memory (parallel.zero.offload_optimizer): the fp32 gradients stream from the GPU in chunks
// through pinned staging, AdamW runs on the host's threads (kernels/adamw_math.h: the same
// float operations as the GPU's AdamW kernel, so the weights are bit-identical to an on-GPU
// optimizer's), and the updated weights stream back as bf16. The
// copies of chunk i+1 (down) and i-1 (up) overlap the host update of chunk i. CUDA builds
// only.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "ops/ops.h"

namespace easyctx::train {

struct OffloadPiece {
  float* master = nullptr;          // host f32[n]
  float* m = nullptr;               // host f32[n]
  float* v = nullptr;               // host f32[n]
  const float* grad_dev = nullptr;  // device f32[n]
  void* work_dev = nullptr;         // device bf16[n]: receives the updated weights
  int64_t n = 0;
  double weight_decay = 0;
};

class HostAdamW {
 public:
  // chunk_elems: elements per pinned staging slot (two slots of f32 + bf16).
  explicit HostAdamW(int64_t chunk_elems);
  ~HostAdamW();
  HostAdamW(const HostAdamW&) = delete;
  HostAdamW& operator=(const HostAdamW&) = delete;

  // One optimizer step over every piece (s.weight_decay is taken from each piece). The
  // device gradients must be final (the caller has synchronised its stream); returns when
  // the device weights are updated.
  void step(const std::vector<OffloadPiece>& pieces, const ops::AdamWStep& s);
  // Seconds of the last step() (host update and copies).
  double last_seconds() const { return last_seconds_; }
  int64_t pinned_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  double last_seconds_ = 0;
};

// f32 -> bf16 bits of n values (ops::float_to_bf16: round to nearest even, as the GPU's
// conversion), on the host's threads.
void f32_to_bf16(const float* src, uint16_t* dst, int64_t n);

}  // namespace easyctx::train
