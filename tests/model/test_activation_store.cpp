// The ActivationStore on its own (lib/model/activation_store.h): what a forward saves into it
// comes back in the backward, for every placement (device slots, the offload ring with host
// copies, some or all layers keeping their attention output, head groups reading it in place,
// streamed group by group); what it allocates is what its specs say.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model/activation_store.h"
#include "model_run_util.h"
#include "ops/ops.h"

using namespace easyctx;
using easyctx::CheckpointPolicy;
using model::ActivationStore;
using ops::DType;
using ops::Tensor;

namespace {

model::LlamaConfig config(int64_t layers) {
  model::LlamaConfig c;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = layers;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 4;
  c.vocab_size = 29;
  return c;
}

void fill(const Tensor& t, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  float* p = t.ptr<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = nd(rng);
}

std::vector<float> values(const Tensor& t) { return {t.ptr<float>(), t.ptr<float>() + t.numel()}; }

bool same(const Tensor& t, const std::vector<float>& v) {
  return t.numel() == static_cast<int64_t>(v.size()) && std::memcmp(t.ptr<float>(), v.data(), v.size() * 4) == 0;
}

struct Case {
  CheckpointPolicy policy;
  bool offload;
  int64_t offload_layers, output_layers, groups;
  model::ModelOptions options() const {
    model::ModelOptions mo{policy, 7, 0};
    mo.offload_checkpoints = offload;
    mo.offload_layers = offload_layers;
    mo.attention_output_layers = output_layers;
    mo.head_groups = groups;
    return mo;
  }
  std::string name() const {
    return std::string(to_string(policy)) + (offload ? " offload " + std::to_string(offload_layers) : "") + " kept " +
           std::to_string(output_layers) + " G " + std::to_string(groups);
  }
};

std::vector<Case> cases() {
  std::vector<Case> v;
  for (CheckpointPolicy p : {CheckpointPolicy::Layer, CheckpointPolicy::AttentionOutput})
    for (bool off : {false, true})
      for (int64_t K : {0, 1, 3})
        for (int64_t M : {0, 2})
          for (int64_t G : {1, 2})
            if ((off || K == 0) && (p == CheckpointPolicy::AttentionOutput || M == 0)) v.push_back({p, off, K, M, G});
  return v;
}

}  // namespace

// One forward writes fresh values into every layer input and every kept attention output the
// way LlamaModel does (make_room, the layer's writes, save); the backward, layers L-1..0,
// finds each of them bit for bit after prefetch, whatever ring slot or host buffer held it.
TEST(ActivationStore, WhatTheForwardSavesTheBackwardReads) {
  const int64_t L = 5, B = 2, S = 7;
  const model::LlamaConfig cfg = config(L);
  const int64_t n = B * S, qd = cfg.q_dim(), lse_n = B * cfg.num_heads * S;
  for (const Case& c : cases()) {
    const model::ModelOptions mo = c.options();
    auto be = ops::make_cpu_backend();
    ActivationStore store(*be, {cfg, mo, DType::F32, B, S, true});
    std::mt19937_64 rng(test::test_seed());
    ops::Buffer o = be->alloc(DType::F32, n * qd), lse = be->alloc(DType::F32, lse_n);
    std::vector<std::vector<float>> inputs(L + 1), outs(L), lses(L);
    for (int step = 0; step < 2; ++step) {  // the second step reuses the slots and fences
      store.begin();
      fill(store.input(0), rng);
      inputs[0] = values(store.input(0));
      for (int64_t l = 0; l < L; ++l) {
        store.make_room(l);
        fill(store.input(l + 1), rng);  // the layer's output
        inputs[l + 1] = values(store.input(l + 1));
        fill(o.flat(), rng);
        fill(lse.flat(), rng);
        outs[l] = values(o.flat());
        lses[l] = values(lse.flat());
        const model::SavedAttention target = store.output_target(l);
        EXPECT_EQ(!target.o.empty(), store.keeps_output(l) && c.groups > 1) << c.name() << " layer " << l;
        for (int64_t g = 0; g < c.groups && !target.o.empty(); ++g) {  // head groups write group by group
          const int64_t po = n * qd / c.groups, pl = lse_n / c.groups;
          const Tensor go = o.flat().slice_flat(g * po, {po}), gl = lse.flat().slice_flat(g * pl, {pl});
          if (store.streams_outputs()) {
            const ActivationStore::GroupSlot s = store.next_group_slot();
            be->copy(s.o, go);
            be->copy(s.lse, gl);
            store.send_group(s, target.o.slice_flat(g * po, {po}), target.lse.slice_flat(g * pl, {pl}));
          } else {
            be->copy(target.o.slice_flat(g * po, {po}), go);
            be->copy(target.lse.slice_flat(g * pl, {pl}), gl);
          }
        }
        store.save(l, o.flat(), lse.flat());
      }
      EXPECT_TRUE(same(store.input(L), inputs[L])) << c.name();
      for (int64_t l = L - 1; l >= 0; --l) {
        store.prefetch(l);
        EXPECT_TRUE(same(store.input(l), inputs[l])) << c.name() << " input of layer " << l;
        fill(o.flat(), rng);  // what the layer's buffers held before: overwritten or ignored
        const model::SavedAttention saved = store.attention_output(l, o.flat(), lse.flat());
        const bool kept =
            c.policy == CheckpointPolicy::AttentionOutput && (c.output_layers == 0 || l >= L - c.output_layers);
        EXPECT_EQ(saved.restored, kept) << c.name() << " layer " << l;
        if (!kept) continue;
        if (c.groups == 1) {
          EXPECT_TRUE(same(o.flat(), outs[l]) && same(lse.flat(), lses[l])) << c.name() << " layer " << l;
          continue;
        }
        for (int64_t g = 0; g < c.groups; ++g) {
          const int64_t po = n * qd / c.groups, pl = lse_n / c.groups;
          const std::vector<float> want_o(outs[l].begin() + g * po, outs[l].begin() + (g + 1) * po);
          const std::vector<float> want_l(lses[l].begin() + g * pl, lses[l].begin() + (g + 1) * pl);
          if (store.streams_outputs()) {
            const ActivationStore::GroupSlot s = store.fetch_group(saved.o, saved.lse, g, c.groups, true);
            EXPECT_TRUE(same(s.o, want_o) && same(s.lse, want_l)) << c.name() << " layer " << l << " group " << g;
          } else {
            EXPECT_TRUE(same(saved.o.slice_flat(g * po, {po}), want_o) &&
                        same(saved.lse.slice_flat(g * pl, {pl}), want_l))
                << c.name() << " layer " << l << " group " << g;
          }
        }
      }
    }
  }
}

// The store allocates exactly its specs (every one with a shape and a label for the plan),
// host buffers only for what leaves, and none of them without offload.
TEST(ActivationStore, AllocatesWhatItsSpecsSay) {
  const model::LlamaConfig cfg = config(4);
  for (const Case& c : cases()) {
    const model::ModelOptions mo = c.options();
    const model::WorkspaceDims dims{cfg, mo, DType::F32, 2, 9, true};
    std::vector<model::BufferSpec> specs;
    const model::BufferVisit add = [&](const model::BufferSpec& s, ops::Buffer* slot) {
      EXPECT_EQ(slot, nullptr);
      specs.push_back(s);
    };
    ActivationStore::visit_inputs(dims, nullptr, add);
    ActivationStore::visit_outputs(dims, nullptr, add);
    auto be = ops::make_cpu_backend();
    const int64_t before = be->memory_stats().live_bytes;
    {
      ActivationStore store(*be, dims);
      EXPECT_EQ(be->memory_stats().live_bytes - before, test::spec_bytes(specs)) << c.name();
    }
    EXPECT_EQ(be->memory_stats().live_bytes, before) << c.name();
    int host = 0;
    for (const model::BufferSpec& s : specs) {
      EXPECT_FALSE(s.shape.empty() || s.label.empty()) << s.name;
      host += s.pinned_host;
    }
    EXPECT_EQ(host > 0, c.offload) << c.name();
  }
}

// The ring's placement: K offloaded inputs share two device slots with the next two; the rest
// have their own. The bounds of offload_layers and attention_output_layers.
TEST(ActivationStore, RingSlotsAndBounds) {
  const model::OffloadRing none{0}, two{2};
  for (int64_t l = 0; l < 6; ++l) EXPECT_EQ(none.slot(l), static_cast<size_t>(l));  // a slot each
  EXPECT_EQ(none.slots(5), 6u);
  const size_t want[] = {0, 1, 0, 1, 2, 3};  // l <= K + 1 alternate, then l - K
  for (int64_t l = 0; l < 6; ++l) EXPECT_EQ(two.slot(l), want[l]) << l;
  EXPECT_EQ(two.slots(5), 4u);
  EXPECT_TRUE(two.offloaded(1));
  EXPECT_FALSE(two.offloaded(2));
  model::ModelOptions mo;
  for (int64_t k : {0, 9}) {
    mo.offload_layers = k;
    EXPECT_EQ(model::offloaded_inputs(mo, 6), 5) << k;  // all but the last layer's
  }
  mo.offload_layers = 2;
  EXPECT_EQ(model::offloaded_inputs(mo, 6), 2);
  for (int64_t m : {0, 6, 7}) {
    mo.attention_output_layers = m;
    EXPECT_EQ(model::first_kept_output(mo, 6), 0) << m;
  }
  mo.attention_output_layers = 2;
  EXPECT_EQ(model::first_kept_output(mo, 6), 4);
}
