// attention/strategy.h: the pure split (layout, padding multiple, local length) per mode and
// its agreement with the loader's slicing; the factory's strategy per mode; and the replay
// contract the memory plan relies on: on its recording backend (plan/recorder.h: no compute,
// fake pointers that crash if read on the host) with no-op communicators of the same ranks and sizes, every
// strategy allocates only labelled buffers, and its peak equals the peak the CPU backend
// measures for the same call with real data over MPI.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "attention/head_grouped.h"
#include "attention/strategy.h"
#include "attention/zigzag_ring.h"
#include "core/config.h"
#include "data/sp_slice.h"
#include "dist/groups.h"
#include "plan/recorder.h"
#include "test_util.h"

using namespace easyctx;
using ops::Buffer;
using ops::DType;
using ops::Tensor;

namespace {

// Fake device addresses, never mapped: a strategy that reads tensor data on the host crashes.
void* fake_address(int64_t bytes) {
  static uintptr_t next = uintptr_t{1} << 45;
  void* p = reinterpret_cast<void*>(next);
  next += static_cast<uintptr_t>((bytes + 255) / 256 * 256 + 4096);
  return p;
}

StageConfig sp_config(SeqParallelMode mode, int size, int ulysses = 0, int64_t head_groups = 1) {
  StageConfig cfg;
  cfg.parallel.sequence.mode = mode;
  cfg.parallel.sequence.size = size;
  cfg.parallel.sequence.ulysses_size = mode == SeqParallelMode::Usp ? ulysses : 0;
  cfg.activation.attention_head_groups = head_groups;
  return cfg;
}

struct Shape {
  int64_t B, S, Hq, Hkv, hd;  // S: this rank's tokens
};

// The call's tensors over `data` (q, k, v, o, lse, dout, dq, dk, dv in this order).
struct Call {
  attention::AttentionTensors t;
  attention::AttentionGrads g;
};
Call make_call(const Shape& s, const std::vector<void*>& data, DType dt, MemSpace space) {
  auto T4 = [&](size_t i, int64_t H) { return Tensor(data[i], dt, {s.B, s.S, H, s.hd}, space); };
  return {{T4(0, s.Hq), T4(1, s.Hkv), T4(2, s.Hkv), T4(3, s.Hq), Tensor(data[4], dt, {s.B, s.Hq, s.S}, space),
           1.0 / std::sqrt(static_cast<double>(s.hd))},
          {T4(5, s.Hq), T4(6, s.Hq), T4(7, s.Hkv), T4(8, s.Hkv)}};
}
std::vector<int64_t> call_sizes(const Shape& s) {
  const int64_t q = s.B * s.S * s.Hq * s.hd, kv = s.B * s.S * s.Hkv * s.hd;
  return {q, kv, kv, q, s.B * s.Hq * s.S, q, q, kv, kv};
}

struct Peaks {
  int64_t fwd = 0, bwd = 0;
};
Peaks run_measured(attention::SequenceAttention& a, ops::Backend& be, const Call& c) {
  Peaks p;
  const int64_t live = be.memory_stats().live_bytes;
  be.reset_peak_memory();
  a.forward(c.t);
  p.fwd = be.memory_stats().peak_bytes - live;
  be.reset_peak_memory();
  a.backward(c.t, c.g);
  p.bwd = be.memory_stats().peak_bytes - live;
  EXPECT_EQ(be.memory_stats().live_bytes, live) << a.name() << " left buffers allocated";
  return p;
}

// Every label the strategies use: the memory plan's item names.
const std::set<std::string>& known_labels() {
  static const std::set<std::string> s = [] {
    std::set<std::string> l;
    for (const char* tag : {"zigzag_ring ", "usp ring "})
      for (const char* n : {"running output (f32)", "running LSE", "block output", "block LSE", "K/V double buffer",
                            "LSE chunks", "dQ accumulator (f32)", "dK/dV accumulators (f32, travel with K/V)"})
        l.insert(std::string(tag) + n);
    for (const char* n :
         {"output accumulator (f32)", "block output", "block LSE", "received K, V", "received query", "returned output",
          "returned LSE", "dQ/dK/dV accumulators (f32)", "dK/dV partials and received (f32)", "received q, o, dout",
          "received LSE", "dQ partial and received (f32)"})
      l.insert(std::string("dist_flash ") + n);
    for (const char* tag : {"ulysses ", "usp "})
      for (const char* n :
           {"all-to-all send", "q (head-sharded)", "k (head-sharded)", "v (head-sharded)", "o (head-sharded)",
            "dout (head-sharded)", "LSE (head-sharded)", "dq, dk, dv (head-sharded)", "all-to-all receive",
            "shared kv head sum", "LSE all-to-all send", "LSE all-to-all receive"})
        l.insert(std::string(tag) + n);
    for (const char* n : {"q, o", "q, o, dout", "k, v", "LSE", "dq, dk, dv"})
      l.insert(std::string("head group packs: ") + n);
    return l;
  }();
  return s;
}

struct World {
  std::unique_ptr<dist::Runtime> rt;
  std::unique_ptr<dist::ProcessGroups> pg;
};
World make_world(const StageConfig& cfg) {
  World w;
  int argc = 0;
  char** argv = nullptr;
  w.rt = std::make_unique<dist::Runtime>(&argc, &argv);
  const auto L = dist::make_group_layout(cfg, w.rt->size(), w.rt->topology().local_size);
  w.pg = std::make_unique<dist::ProcessGroups>(*w.rt, L, dist::CommBackend::Mpi, 120.0);
  return w;
}

int world_size() {
  int w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  return w;
}

}  // namespace

// Mode -> layout -> multiple -> local length, and the loader slices exactly that many tokens
// per rank (data::sp_slice on the split's layout).
TEST(SequenceSplit, LayoutMultipleAndLocalLengthPerMode) {
  struct Case {
    SeqParallelMode mode;
    int sp, ulysses;
    SpLayout layout;
    int64_t multiple;
  };
  const Case cases[] = {{SeqParallelMode::ZigzagRing, 3, 0, SpLayout::Zigzag, 6},
                        {SeqParallelMode::DistFlash, 3, 0, SpLayout::Contiguous, 3},
                        {SeqParallelMode::Ulysses, 4, 0, SpLayout::Contiguous, 4},
                        {SeqParallelMode::Usp, 4, 2, SpLayout::Usp, 8},
                        {SeqParallelMode::ZigzagRing, 1, 0, SpLayout::None, 1}};
  for (const Case& k : cases) {
    const auto groups = dist::make_group_layout(sp_config(k.mode, k.sp, k.ulysses), 12, 12);
    const attention::SequenceSplit split = attention::sequence_split(groups);
    SCOPED_TRACE(std::string(to_string(k.mode)) + " x " + std::to_string(k.sp));
    EXPECT_EQ(split.layout, k.layout);
    EXPECT_EQ(split.size, k.sp);
    EXPECT_EQ(split.multiple(), k.multiple);
    for (int64_t L : {int64_t{1}, int64_t{37}, int64_t{48}, int64_t{1000003}}) {
      const int64_t Lp = split.padded_length(L);
      EXPECT_EQ(Lp % k.multiple, 0);
      EXPECT_LT(Lp - L, k.multiple);
      EXPECT_EQ(split.local_length(L), k.sp == 1 ? L : Lp / k.sp);
      EXPECT_EQ(split.local_length(L), data::sp_local_length(L, split.layout, split.size, split.inner));
    }
    std::vector<uint32_t> window(38);
    for (size_t i = 0; i < window.size(); ++i) window[i] = static_cast<uint32_t>(i);
    for (int r = 0; r < k.sp; ++r)
      EXPECT_EQ(static_cast<int64_t>(
                    data::sp_slice(window.data(), 37, split.layout, split.size, r, 0, split.inner).tokens.size()),
                split.local_length(37));
  }
  dist::GroupLayout none;
  none.sp_size = 2;
  none.mode = SeqParallelMode::None;
  EXPECT_THROW(attention::sequence_split(none), InputError);
}

// One rank per sequence: local attention, wrapped in head groups when asked.
TEST(SequenceStrategy, LocalWithOneRankPerSequence) {
  auto be = ops::make_cpu_backend();
  const auto one = plan::make_recording_comm("sp", 1, 0, MemSpace::Host);
  const auto groups = dist::make_group_layout(sp_config(SeqParallelMode::ZigzagRing, 1), 4, 4);
  auto a =
      attention::make_sequence_attention(sp_config(SeqParallelMode::ZigzagRing, 1), groups, {*one, *one, *one}, *be);
  EXPECT_STREQ(a->name(), "local");
  EXPECT_NE(dynamic_cast<attention::LocalAttention*>(a.get()), nullptr);
  auto g = attention::make_local_attention(sp_config(SeqParallelMode::ZigzagRing, 1, 0, 3), *be);
  auto* hg = dynamic_cast<attention::HeadGroupedAttention*>(g.get());
  ASSERT_NE(hg, nullptr);
  EXPECT_EQ(hg->groups(), 3);
  EXPECT_STREQ(g->name(), "local");
}

// The replay contract, for every mode the world allows, with and without head groups and
// with kv heads split or replicated across Ulysses ranks.
TEST(SequenceStrategy, ReplayPeakEqualsCpuPeak) {
  const int W = world_size();
  struct Mode {
    SeqParallelMode mode;
    int ulysses;
    const char* name;
  };
  const Mode modes[] = {{SeqParallelMode::ZigzagRing, 0, "zigzag_ring"},
                        {SeqParallelMode::Ulysses, 0, "ulysses"},
                        {SeqParallelMode::DistFlash, 0, "dist_flash"},
                        {SeqParallelMode::Usp, 2, "usp"}};
  struct Heads {
    int64_t hkv, groups;
  };
  const Heads heads[] = {{2 * W, 1}, {2 * W, 2}, {1, 1}};
  for (const Mode& m : modes) {
    if (m.mode == SeqParallelMode::Usp && W % 2 != 0) continue;
    World w = make_world(sp_config(m.mode, W, m.ulysses));
    const attention::SequenceSplit split = attention::sequence_split(w.pg->layout());
    for (const Heads& h : heads) {
      const StageConfig cfg = sp_config(m.mode, W, m.ulysses, h.groups);
      const Shape sh{2, split.local_length(10 * W + 1), 4 * W, h.hkv, 8};
      SCOPED_TRACE(std::string(m.name) + ", W " + std::to_string(W) + ", Hkv " + std::to_string(h.hkv) + ", G " +
                   std::to_string(h.groups));
      // The real call: CPU backend, MPI, random data.
      auto cpu = ops::make_cpu_backend();
      auto real = attention::make_sequence_attention(cfg, *w.pg, *cpu);
      EXPECT_STREQ(real->name(), m.name);
      std::mt19937_64 rng(test::test_seed());
      std::vector<std::vector<double>> host;
      std::vector<void*> ptrs;
      for (int64_t n : call_sizes(sh)) {
        host.push_back(test::random_vector<double>(static_cast<size_t>(n), rng));
        ptrs.push_back(host.back().data());
      }
      const Peaks measured = run_measured(*real, *cpu, make_call(sh, ptrs, DType::F64, MemSpace::Host));
      // The replay (the memory plan's, plan/recorder.h): no compute, no data, communicators
      // with the same ranks and sizes whose operations do nothing.
      plan::AllocRecorder recorder;
      plan::RecordingOptions ro;
      ro.space = MemSpace::Device;
      const auto rec = plan::make_recording_backend(recorder, ro);
      const auto sp = plan::make_recording_comm("sp", w.pg->sp().size(), w.pg->sp().rank(), MemSpace::Device);
      const auto ring = plan::make_recording_comm("ring", w.pg->ring().size(), w.pg->ring().rank(), MemSpace::Device);
      const auto uly =
          plan::make_recording_comm("ulysses", w.pg->ulysses().size(), w.pg->ulysses().rank(), MemSpace::Device);
      auto replay = attention::make_sequence_attention(cfg, w.pg->layout(), {*sp, *ring, *uly}, *rec);
      std::vector<void*> fake;
      for (int64_t n : call_sizes(sh)) fake.push_back(fake_address(n * 8));
      const Peaks recorded = run_measured(*replay, *rec, make_call(sh, fake, DType::F64, MemSpace::Device));
      EXPECT_GT(measured.fwd, 0);
      EXPECT_EQ(recorded.fwd, measured.fwd);
      EXPECT_EQ(recorded.bwd, measured.bwd);
      for (const std::string& l : recorder.labels()) EXPECT_EQ(known_labels().count(l), 1u) << "label '" << l << "'";
    }
  }
}

// Comm timing (bench/ring) changes how the host waits, not the result; off, nothing is timed.
TEST(SequenceStrategy, ZigzagCommTimingSameResult) {
  const int W = world_size();
  World w = make_world(sp_config(SeqParallelMode::ZigzagRing, W));
  auto be = ops::make_cpu_backend();
  const Shape sh{1, 6, 4, 2, 8};
  std::mt19937_64 rng(test::test_seed());
  std::vector<std::vector<float>> in, out[2];
  for (int64_t n : call_sizes(sh)) in.push_back(test::random_vector<float>(static_cast<size_t>(n), rng));
  for (int timed = 0; timed < 2; ++timed) {
    attention::ZigzagRingAttention ring(*be, w.pg->ring());
    ring.set_comm_timing(timed == 1);
    out[timed] = in;
    std::vector<void*> ptrs;
    for (auto& v : out[timed]) ptrs.push_back(v.data());
    const Call c = make_call(sh, ptrs, DType::F32, MemSpace::Host);
    ring.forward(c.t);
    ring.backward(c.t, c.g);
    if (timed) EXPECT_GT(ring.comm_seconds(), 0.0);
    else EXPECT_EQ(ring.comm_seconds(), 0.0);
  }
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(out[0][i], out[1][i]) << "tensor " << i;
}
