// Where a training step keeps each layer's checkpoint between the forward and the backward:
// the layer inputs (the residual stream) and, with checkpoint attention_output, the kept
// attention outputs and LSE. The model's math asks the store for a layer's input, saves a
// layer's attention output into it and reads it back; where the bytes live (a device slot of
// their own, a ring of two device slots with the rest in pinned host memory, or, with head
// groups, host buffers streamed through two group-sized slots) is the store's business.
//
// Offload (ModelOptions::offload_checkpoints): the first K layer inputs and the outputs of
// the kept layers below K - 1 leave for host memory while the next layer computes (forward)
// and come back one layer ahead of the backward (prefetch), on the backend's copy stream
// (Backend::copy_async / wait_copy): the results are bit-identical to keeping them all.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/llama.h"

namespace easyctx::model {

// Where checkpoint l lives when the first K of them go to host memory: checkpoints 0..K+1
// share a ring of two device slots (l % 2; 0..K-1 leave for the host while the next layer
// computes and come back one layer ahead of the backward), K+2.. have slots of their own
// (slot l - K). K = 0 is "nothing offloaded": slot l for every l.
struct OffloadRing {
  int64_t K = 0;
  size_t slot(int64_t l) const { return static_cast<size_t>(l <= K + 1 ? l % 2 : l - K); }
  bool offloaded(int64_t l) const { return l < K; }
  // Device slots for checkpoints 0..last.
  size_t slots(int64_t last) const {
    return static_cast<size_t>(last <= K + 1 ? std::min<int64_t>(2, last + 1) : last + 1 - K);
  }
};

// The sizes a model workspace is made for: the model, its options, the compute dtype and one
// micro-batch of batch x seq tokens, for a training step (backward) or a forward-only pass.
struct WorkspaceDims {
  const LlamaConfig& cfg;
  const ModelOptions& opts;
  DType dtype;
  int64_t batch = 0, seq = 0;
  bool backward = false;
  int64_t tokens() const { return batch * seq; }
};

// One buffer to allocate: its spec and where the allocation goes (null when only planning).
using BufferVisit = std::function<void(const BufferSpec&, ops::Buffer*)>;

// A layer's attention output as the layer code sees it. restored: the output is already known
// (the recompute skips the attention). With head groups, o and lse are the checkpoint itself
// (group-major [G][n][Hq/G hd], [G][B][Hq/G][S]), which the layer writes (forward) or reads
// (backward) group by group; empty otherwise (the layer's own o and LSE buffers hold it).
struct SavedAttention {
  bool restored = false;
  ops::Tensor o, lse;
};

class ActivationStore {
 public:
  // Allocates every buffer of the store for `dims` (the order visit_inputs, visit_outputs give).
  ActivationStore(ops::Backend& be, const WorkspaceDims& dims);

  // The store's buffers in allocation order, in two parts (the model allocates its own layer
  // activations between them): the residual stream slots and the host copies of offloaded
  // inputs; then the attention-output checkpoints. `store` non-null: its slots are filled.
  static void visit_inputs(const WorkspaceDims& dims, ActivationStore* store, const BufferVisit& visit);
  static void visit_outputs(const WorkspaceDims& dims, ActivationStore* store, const BufferVisit& visit);

  // The residual stream after l layers (l = 0: the embeddings; l = L: the final hidden
  // states), [n, D]: layer l reads input(l) and writes input(l + 1).
  ops::Tensor input(int64_t l) const;
  // Whether layer l keeps its attention output (checkpoint attention_output, a backward store).
  bool keeps_output(int64_t l) const { return !saved_o_.empty() && l >= keep_from_; }
  // Head groups with offload: every kept output in host memory, streamed through two slots.
  bool streams_outputs() const { return streamed_; }

  // Forward. begin: a new step (every copy of the last one was waited for). make_room(l):
  // before layer l runs, the slots it writes are free (their copies out are done) and layer
  // l's input leaves for the host if it is offloaded. output_target(l): where layer l writes
  // its attention output itself (head groups); empty when save() takes it afterwards.
  // save(l, o, lse): after layer l, its attention output into its checkpoint (copied from the
  // layer's o and LSE unless written there already) and on to the host if it leaves.
  void begin();
  void make_room(int64_t l);
  SavedAttention output_target(int64_t l) const;
  void save(int64_t l, const ops::Tensor& o, const ops::Tensor& lse);

  // Backward, layers L-1..0. prefetch(l): layer l - 1's checkpoints start back while layer l
  // computes, and layer l's are waited for: input(l) is then ready. attention_output(l, o,
  // lse): layer l's kept output (copied into the layer's o and LSE unless head groups read
  // it in place); restored false when the layer keeps none (the recompute redoes it).
  void prefetch(int64_t l);
  SavedAttention attention_output(int64_t l, const ops::Tensor& o, const ops::Tensor& lse);

  // Streamed outputs (streams_outputs()), one head group at a time. next_group_slot: a free
  // device slot for the group computed now; send_group: its o and LSE on to the layer's host
  // checkpoint (host_o, host_lse: that group's parts). fetch_group: group g's o (and LSE)
  // back from the layer's host checkpoint, the fetch of group g + 1 issued before returning,
  // so it overlaps group g's work; the slot returned is ready.
  struct GroupSlot {
    size_t index = 0;
    ops::Tensor o, lse;
  };
  GroupSlot next_group_slot();
  void send_group(const GroupSlot& s, const ops::Tensor& host_o, const ops::Tensor& host_lse);
  GroupSlot fetch_group(const ops::Tensor& host_o, const ops::Tensor& host_lse, int64_t g, int64_t groups,
                        bool with_lse);

 private:
  size_t saved_slot(int64_t l) const { return saved_ring_.slot(l - keep_from_); }
  size_t saved_host(int64_t l) const { return static_cast<size_t>(l - keep_from_); }
  bool saved_offloaded(int64_t l) const { return keeps_output(l) && saved_ring_.offloaded(l - keep_from_); }
  // Layer l's attention-output checkpoint (group-major): its device slot, or, streamed, its
  // host buffers.
  ops::Tensor saved_o_of(int64_t l) const;
  ops::Tensor saved_lse_of(int64_t l) const;

  ops::Backend& be_;
  int64_t n_ = 0, d_ = 0;
  bool backward_ = false;
  bool offload_ = false;  // backward with offload_checkpoints
  bool grouped_ = false;  // head groups > 1: outputs written and read group by group
  bool streamed_ = false;
  OffloadRing ring_;                              // layer inputs
  OffloadRing saved_ring_;                        // kept attention outputs (index l - keep_from_)
  int64_t keep_from_ = 0;                         // layers keep_from_..L-1 keep theirs
  std::vector<ops::Buffer> resid_;                // [n, D]: backward ring_.slots(L), forward-only 2
  std::vector<ops::Buffer> host_resid_;           // ring_.K x [n, D]: inputs of layers 0..K-1 (pinned)
  std::vector<ops::Buffer> saved_o_, saved_lse_;  // device slots ([n, Hq hd], [B, Hq, S]; streamed: 2 groups')
  std::vector<ops::Buffer> host_o_, host_lse_;    // saved_ring_.K of them (streamed: every kept layer's)
  ops::CopyFence resid_out_[2], saved_out_[2];    // per ring slot: its last copy out (forward)
  ops::CopyFence fetched_[2];                     // per ring slot: its last copy in (backward)
  ops::CopyFence group_fence_[2];                 // per group slot: its last copy, out or in
  size_t next_group_ = 0;                         // the group slot used next (they alternate)
};

// Layer inputs that leave the device: offload_layers, at most L - 1 (the last layer's input,
// which the backward starts with, never travels).
int64_t offloaded_inputs(const ModelOptions& o, int64_t L);
// The first layer that keeps its attention output (checkpoint AttentionOutput): the last
// attention_output_layers of L keep theirs (0 or more than L: all, so 0).
int64_t first_kept_output(const ModelOptions& o, int64_t L);

}  // namespace easyctx::model
