#include "model/activation_store.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "model/llama_workspace.h"

namespace easyctx::model {

using ops::Buffer;
using ops::Tensor;

namespace {

std::string indexed(const char* base, size_t i) { return std::string(base) + "." + std::to_string(i); }

}  // namespace

int64_t offloaded_inputs(const ModelOptions& o, int64_t L) {
  const int64_t all = std::max<int64_t>(0, L - 1);
  return (o.offload_layers <= 0 || o.offload_layers > all) ? all : o.offload_layers;
}

int64_t first_kept_output(const ModelOptions& o, int64_t L) {
  return (o.attention_output_layers <= 0 || o.attention_output_layers >= L) ? 0 : L - o.attention_output_layers;
}

ActivationStore::ActivationStore(ops::Backend& be, const WorkspaceDims& dims)
    : be_(be),
      n_(dims.tokens()),
      d_(dims.cfg.hidden_size),
      backward_(dims.backward),
      offload_(dims.backward && dims.opts.offload_checkpoints),
      grouped_(dims.opts.head_groups > 1) {
  const BufferVisit alloc = [&](const BufferSpec& s, Buffer* slot) {
    *slot = s.pinned_host ? be_.alloc_host_pinned(s.dtype, s.numel) : be_.alloc(s.dtype, s.numel);
  };
  visit_inputs(dims, this, alloc);
  visit_outputs(dims, this, alloc);
}

// A backward keeps every layer input until its layer's backward: ring_.slots(L) device slots
// (L + 1 without offload: the inputs of layers 0..L-1 and the final hidden states), the first
// K in host memory. A forward-only pass needs two slots, used in turn.
void ActivationStore::visit_inputs(const WorkspaceDims& dims, ActivationStore* s, const BufferVisit& visit) {
  const int64_t n = dims.tokens(), d = dims.cfg.hidden_size, L = dims.cfg.num_layers;
  const OffloadRing ring{dims.backward && dims.opts.offload_checkpoints ? offloaded_inputs(dims.opts, L) : 0};
  const size_t device = dims.backward ? ring.slots(L) : 2, host = static_cast<size_t>(ring.K);
  if (s) {
    s->ring_ = ring;
    s->resid_.resize(device);
    s->host_resid_.resize(host);
  }
  const char* what = dims.backward ? "residual stream (layer inputs kept for backward)" : "residual stream (in turn)";
  for (size_t l = 0; l < device; ++l)
    visit({indexed("resid", l), dims.dtype, n * d, false, "n x D", what}, s ? &s->resid_[l] : nullptr);
  for (size_t l = 0; l < host; ++l)
    visit({indexed("host.resid", l), dims.dtype, n * d, true, "n x D", "offloaded layer inputs"},
          s ? &s->host_resid_[l] : nullptr);
}

// Checkpoint attention_output: the kept layers' outputs (keep_from..L-1) in device slots, those
// below K - 1 (K offloaded inputs) in a ring of two with host copies; streamed (head groups
// with offload): every kept layer's in host memory and two group-sized device slots.
void ActivationStore::visit_outputs(const WorkspaceDims& dims, ActivationStore* s, const BufferVisit& visit) {
  const ModelOptions& o = dims.opts;
  const int64_t L = dims.cfg.num_layers, G = o.head_groups;
  const int64_t keep_from = first_kept_output(o, L), kept = L - keep_from;
  const OffloadRing ring{dims.backward && o.offload_checkpoints ? offloaded_inputs(o, L) : 0};
  const OffloadRing saved_ring{std::max<int64_t>(0, ring.K - 1 - keep_from)};
  if (s) {
    s->saved_ring_ = saved_ring;
    s->keep_from_ = keep_from;
  }
  if (!dims.backward || o.checkpoint != CheckpointPolicy::AttentionOutput) return;
  const bool streamed = o.streams_attention_output();
  const size_t device = streamed ? 2 : saved_ring.slots(kept - 1);
  const size_t host = streamed ? static_cast<size_t>(kept) : static_cast<size_t>(saved_ring.K);
  const int64_t per_device = streamed ? G : 1;
  const int64_t o_n = dims.tokens() * dims.cfg.q_dim(), lse_n = dims.batch * dims.cfg.num_heads * dims.seq;
  const DType st = stat_dtype(dims.dtype);
  if (s) {
    s->streamed_ = streamed;
    s->saved_o_.resize(device);
    s->saved_lse_.resize(device);
    s->host_o_.resize(host);
    s->host_lse_.resize(host);
  }
  const char* o_shape = streamed ? "n x Hq/G x hd" : "n x Hq x hd";
  const char* lse_shape = streamed ? "B x Hq/G x S" : "B x Hq x S";
  for (size_t l = 0; l < device; ++l) {
    visit({indexed("saved_o", l), dims.dtype, o_n / per_device, false, o_shape, "attention-output checkpoints"},
          s ? &s->saved_o_[l] : nullptr);
    visit({indexed("saved_lse", l), st, lse_n / per_device, false, lse_shape, "attention-LSE checkpoints"},
          s ? &s->saved_lse_[l] : nullptr);
  }
  for (size_t l = 0; l < host; ++l) {
    visit({indexed("host.saved_o", l), dims.dtype, o_n, true, "n x Hq x hd", "attention-output checkpoints"},
          s ? &s->host_o_[l] : nullptr);
    visit({indexed("host.saved_lse", l), st, lse_n, true, "B x Hq x S", "attention-LSE checkpoints"},
          s ? &s->host_lse_[l] : nullptr);
  }
}

Tensor ActivationStore::input(int64_t l) const {
  return resid_[backward_ ? ring_.slot(l) : static_cast<size_t>(l % 2)].view({n_, d_});
}

Tensor ActivationStore::saved_o_of(int64_t l) const {
  return (streamed_ ? host_o_[saved_host(l)] : saved_o_[saved_slot(l)]).flat();
}

Tensor ActivationStore::saved_lse_of(int64_t l) const {
  return (streamed_ ? host_lse_[saved_host(l)] : saved_lse_[saved_slot(l)]).flat();
}

void ActivationStore::begin() {
  for (ops::CopyFence* f : {resid_out_, saved_out_, fetched_, group_fence_}) f[0] = f[1] = {};
}

// Layer l writes over layer l - 2's input slot (so its copy out must be done) and sends its
// own input out meanwhile; its attention output goes to the slot layer l - 2's left.
void ActivationStore::make_room(int64_t l) {
  if (!offload_) return;
  be_.wait_copy(resid_out_[(l + 1) % 2]);
  if (ring_.offloaded(l))
    resid_out_[l % 2] = be_.copy_async(host_resid_[static_cast<size_t>(l)].flat(), resid_[ring_.slot(l)].flat());
  if (keeps_output(l) && !streamed_) be_.wait_copy(saved_out_[l % 2]);
}

SavedAttention ActivationStore::output_target(int64_t l) const {
  if (!keeps_output(l) || !grouped_) return {};
  return {false, saved_o_of(l), saved_lse_of(l)};
}

void ActivationStore::save(int64_t l, const Tensor& o, const Tensor& lse) {
  if (!keeps_output(l) || streamed_) return;  // (streamed: every group left as it was computed)
  const size_t s = saved_slot(l);
  if (!grouped_) {
    be_.copy(saved_o_[s].flat(), o);
    be_.copy(saved_lse_[s].flat(), lse);
  }
  if (saved_offloaded(l)) {  // (one copy stream: the fence of the second copy covers the first)
    be_.copy_async(host_o_[saved_host(l)].flat(), saved_o_[s].flat());
    saved_out_[l % 2] = be_.copy_async(host_lse_[saved_host(l)].flat(), saved_lse_[s].flat());
  }
}

// Layer l - 1's checkpoints come back while layer l computes, into the ring slots that layer
// l + 1 (or the head) used last; layer l's came back during layer l + 1, unless they never left.
void ActivationStore::prefetch(int64_t l) {
  if (!offload_) return;
  const int64_t j = l - 1;
  if (j >= 0 && ring_.offloaded(j)) {
    const size_t s = static_cast<size_t>(j % 2);
    fetched_[s] = be_.copy_async(resid_[s].flat(), host_resid_[static_cast<size_t>(j)].flat());
    if (!streamed_ && saved_offloaded(j)) {
      const size_t so = saved_slot(j), h = saved_host(j);
      be_.copy_async(saved_o_[so].flat(), host_o_[h].flat());
      fetched_[s] = be_.copy_async(saved_lse_[so].flat(), host_lse_[h].flat());
    }
  }
  if (ring_.offloaded(l)) be_.wait_copy(fetched_[l % 2]);
}

SavedAttention ActivationStore::attention_output(int64_t l, const Tensor& o, const Tensor& lse) {
  if (!keeps_output(l)) return {};
  if (grouped_) return {true, saved_o_of(l), saved_lse_of(l)};
  be_.copy(o, saved_o_[saved_slot(l)].flat());
  be_.copy(lse, saved_lse_[saved_slot(l)].flat());
  return {true, {}, {}};
}

ActivationStore::GroupSlot ActivationStore::next_group_slot() {
  EASYCTX_CHECK(streamed_, "ActivationStore: group slots without streamed attention outputs");
  const size_t s = next_group_;
  next_group_ ^= 1;
  be_.wait_copy(group_fence_[s]);  // its last copy (two groups ago) is done
  return {s, saved_o_[s].flat(), saved_lse_[s].flat()};
}

void ActivationStore::send_group(const GroupSlot& s, const Tensor& host_o, const Tensor& host_lse) {
  be_.copy_async(host_o, s.o);
  group_fence_[s.index] = be_.copy_async(host_lse, s.lse);  // (one copy stream: covers both)
}

// The fetch of group g + 1 lands in the other slot, whose last reader (group g - 1) is already
// queued, and copy_async runs after everything queued so far.
ActivationStore::GroupSlot ActivationStore::fetch_group(const Tensor& host_o, const Tensor& host_lse, int64_t g,
                                                        int64_t groups, bool with_lse) {
  EASYCTX_CHECK(streamed_, "ActivationStore: group fetch without streamed attention outputs");
  const int64_t per_o = saved_o_[0].numel(), per_lse = saved_lse_[0].numel();
  auto issue = [&](int64_t j) {
    const size_t s = next_group_;
    next_group_ ^= 1;
    group_fence_[s] = be_.copy_async(saved_o_[s].flat(), group_part(host_o, j, per_o));
    if (with_lse) group_fence_[s] = be_.copy_async(saved_lse_[s].flat(), group_part(host_lse, j, per_lse));
  };
  if (g == 0) issue(0);
  const size_t s = next_group_ ^ 1;  // the slot of the last fetch issued: group g's
  be_.wait_copy(group_fence_[s]);
  if (g + 1 < groups) issue(g + 1);
  return {s, saved_o_[s].flat(), saved_lse_[s].flat()};
}

}  // namespace easyctx::model
