// The memory plan's way of knowing what the code allocates: run the allocating code itself
// (the parameter store's set-up, the sequence-parallel strategies' calls, the model's
// construction) on a RecordingBackend, which computes nothing and keeps every allocation
// with its label (ops::Backend::alloc's `what`), and on RecordingComms, whose collectives do
// nothing. An AllocRecorder follows the live set and keeps it at its peak, per phase. The
// CUDA backend's own scratch of an op (attention backward, ...) is recorded from the same
// spec functions the backend sizes it with.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "ops/ops.h"

namespace easyctx::plan {

class AllocRecorder {
 public:
  struct Entry {
    std::string what;
    int64_t bytes = 0;
  };
  int64_t add(const std::string& what, int64_t bytes);
  void remove(int64_t id);
  // A phase starts: its peak is measured from the live set now.
  void begin_phase();
  int64_t live_bytes() const { return live_bytes_; }
  int64_t peak_bytes() const { return peak_bytes_; }
  // The entries live now, and those live at the phase's peak that were not live when it began.
  std::vector<Entry> live() const;
  std::vector<Entry> peak_extra() const { return peak_extra_; }
  // Every label seen (an unlabelled buffer is "(unnamed buffer)").
  const std::set<std::string>& labels() const { return labels_; }

 private:
  std::set<std::string> labels_;
  std::map<int64_t, Entry> live_;
  std::map<int64_t, bool> at_begin_;  // ids live when the phase began
  std::vector<Entry> peak_extra_;
  int64_t live_bytes_ = 0, peak_bytes_ = 0, next_ = 1;
};

// How a recorded backend stands in for a real one.
struct RecordingOptions {
  MemSpace space = MemSpace::Host;  // the backend it stands for: Device (CUDA) or Host (CPU)
  // alloc_host_pinned goes to this recorder (CUDA: host memory outside the device counters);
  // null: to the backend's own (the CPU backend's pinned buffers are ordinary ones).
  AllocRecorder* pinned = nullptr;
  // CUDA: record the scratch the CUDA backend takes inside ops (attention, LM head, ...).
  bool cuda_scratch = false;
  bool deterministic = true;  // train.deterministic (the attention backward's route)
  bool sm90 = false;          // the Hopper forward route (ops::AttentionRouteOptions::sm90)
  // CUDA: each distinct attention call's shape and route ("backward causal 4096x4096 32/8x128:
  // cudnn tiles"), in the order first seen.
  std::vector<std::string>* routes = nullptr;
};

std::unique_ptr<ops::Backend> make_recording_backend(AllocRecorder& rec, const RecordingOptions& o);

// A communicator of `size` ranks seen from `rank`: every operation does nothing.
std::unique_ptr<dist::Comm> make_recording_comm(const std::string& name, int size, int rank, MemSpace space);

}  // namespace easyctx::plan
