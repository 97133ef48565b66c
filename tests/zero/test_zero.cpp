// The ZeRO-3 pieces on their own (lib/zero), on the CPU under mpirun -np 4: the shard layout,
// the gathered-layer pool and its prefetch window, the double-buffered gradient
// reduce-scatter (also with replica groups), and the host AdamW against the backend's AdamW.
// Values are random per run (seed printed) and checked against sums computed here from every
// rank's contribution, which each rank regenerates from (seed, rank).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <random>

#include "dist/comm_mpi.h"
#include "ops/half.h"
#include "ops/ops.h"
#include "llama_test_util.h"
#include "test_util.h"
#include "kernels/adamw_math.h"
#include "zero/comm_lane.h"
#include "zero/gather_pool.h"
#include "zero/grad_scatter.h"
#include "zero/host_adamw.h"
#include "zero/shard_layout.h"

using namespace easyctx;

namespace {

struct World {
  int rank = 0, size = 1;
  World() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
};

// One seed for every rank (rank 0's, broadcast), so each rank can regenerate the others' data.
uint64_t shared_seed() {
  uint64_t s = test::test_seed();
  MPI_Bcast(&s, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  if (World().rank == 0) std::printf("[seed] %llu\n", static_cast<unsigned long long>(s));
  return s;
}

// Unit u's whole fp32 content (the same on every rank).
std::vector<float> unit_values(uint64_t seed, size_t u, int64_t numel) {
  std::mt19937_64 rng(seed * 31 + u);
  return test::random_vector<float>(static_cast<size_t>(numel), rng);
}

// Rank r's gradient contribution to unit u.
std::vector<float> grad_values(uint64_t seed, int r, size_t u, int64_t numel, int pass) {
  std::mt19937_64 rng(seed ^ (static_cast<uint64_t>(r) * 1000003 + u * 7919 + static_cast<uint64_t>(pass) * 104729));
  return test::random_vector<float>(static_cast<size_t>(numel), rng);
}

model::LlamaConfig tiny_config(int64_t layers) { return test::llama_config("", {12, layers, 3, 1, 4, 20, 37}); }

}  // namespace

TEST(ShardLayout, CutsEveryUnitIntoEqualPaddedShards) {
  const model::ParamLayout layout(tiny_config(2));
  for (int Z : {1, 3, 4, 7}) {
    int64_t total = 0;
    for (int r = 0; r < Z; ++r) {
      const zero::ShardLayout sl(layout, Z, r);
      for (size_t u = 0; u < sl.units(); ++u) {
        const int64_t n = layout.units()[u].numel;
        EXPECT_EQ(sl.len(u), (n + Z - 1) / Z);
        EXPECT_EQ(sl.lo(u), std::min(n, r * sl.len(u)));
        EXPECT_GE(sl.valid(u), 0);
        EXPECT_LE(sl.lo(u) + sl.valid(u), n);
        total += sl.valid(u);
      }
      EXPECT_EQ(sl.total_len(), [&] {
        int64_t s = 0;
        for (size_t u = 0; u < sl.units(); ++u) s += sl.len(u);
        return s;
      }());
    }
    EXPECT_EQ(total, layout.total_numel()) << "the valid parts of all ranks cover every element once (Z=" << Z << ")";
  }
  EXPECT_THROW(zero::ShardLayout(layout, 4, 4), Error);
}

// The model's protocol: one order for forward then recompute + backward, acquire -> release per
// layer. Every acquired view holds the whole unit; the next `prefetch` layers are gathered
// ahead; a layer still in a slot is not gathered again; 2L - (prefetch + 1) gathers in all.
TEST(GatherPool, GathersEachLayerAheadAndReusesResidentOnes) {
  const World w;
  const uint64_t seed = shared_seed();
  auto be = ops::make_cpu_backend();
  dist::MpiComm zero(MPI_COMM_WORLD, "zero", 60);
  const int64_t L = 5, numel = 1003, Z = w.size, len = (numel + Z - 1) / Z;
  for (bool queued : {false, true})
    for (int prefetch : {0, 1, 2}) {
      SCOPED_TRACE(std::string(queued ? "queued lane" : "synchronous lane") + ", prefetch " + std::to_string(prefetch));
      zero::CommLane lane(*be, {&zero}, queued);
      EXPECT_EQ(lane.async(), queued);
      std::vector<std::vector<float>> shard(static_cast<size_t>(L));
      for (size_t u = 0; u < static_cast<size_t>(L); ++u) {
        const std::vector<float> all = unit_values(seed, u, numel);
        shard[u].assign(static_cast<size_t>(len), 0.f);
        for (int64_t i = 0; i < len && w.rank * len + i < numel; ++i)
          shard[u][static_cast<size_t>(i)] = all[static_cast<size_t>(w.rank * len + i)];
      }
      std::vector<ops::Buffer> slots;
      for (int i = 0; i <= prefetch; ++i) slots.push_back(be->alloc(DType::F32, len * Z));
      std::vector<size_t> before;
      zero::GatherPool pool(
          *be, lane, std::move(slots), prefetch,
          [&](size_t u, const ops::Buffer& dst) {
            zero.all_gather(shard[u].data(), dst.flat().ptr<float>(), static_cast<size_t>(len));
          },
          [&](size_t u) { before.push_back(u); });
      std::vector<size_t> order;
      for (size_t u = 0; u < static_cast<size_t>(L); ++u) order.push_back(u);
      for (size_t u = static_cast<size_t>(L); u-- > 0;) order.push_back(u);
      for (int pass = 0; pass < 2; ++pass) {  // two micro-batches: the second starts from what the first left
        pool.begin(order);
        for (size_t k = 0; k < order.size(); ++k) {
          const size_t u = order[k];
          const ops::Tensor t = pool.acquire(u, numel);
          ASSERT_EQ(t.numel(), numel);
          const std::vector<float> all = unit_values(seed, u, numel);
          ASSERT_EQ(std::memcmp(t.ptr<float>(), all.data(), all.size() * sizeof(float)), 0)
              << "unit " << u << " at " << k;
          for (size_t j = 1; j <= static_cast<size_t>(prefetch) && k + j < order.size(); ++j)
            EXPECT_TRUE(pool.holds(order[k + j]))
                << "unit " << order[k + j] << " prefetched " << j << " ahead of " << k;
          pool.release(u);
        }
        if (pass == 0) { EXPECT_EQ(pool.gathers(), 2 * L - (prefetch + 1)); }
      }
      EXPECT_EQ(static_cast<int64_t>(before.size()), pool.gathers()) << "before_gather runs once per gather";
      pool.begin(order);
      EXPECT_THROW(pool.acquire(order[1], numel), Error) << "acquiring out of the announced order";
      pool.shards_written();
      for (size_t u = 0; u < static_cast<size_t>(L); ++u) EXPECT_FALSE(pool.holds(u)) << "stale after new shards";
    }
}

// Each layer's gradient: the sum over the shard group of every rank's contribution, this
// rank's block added into its shard; accumulated over micro-batches; with replica groups also
// summed across them. On a queued lane the sum lands only when the buffer is reused or at
// finish() (the next layer's backward overlaps it).
TEST(GradScatter, AddsEachRanksBlockOfTheSumIntoItsShard) {
  const World w;
  const uint64_t seed = shared_seed();
  auto be = ops::make_cpu_backend();
  const int64_t L = 4, numel = 777;
  for (int replicas : {1, 2})
    for (bool queued : {false, true}) {
      if (w.size % replicas != 0) continue;  // (replica groups need an even rank count)
      SCOPED_TRACE(std::to_string(replicas) + " replica group(s), " + (queued ? "queued" : "synchronous"));
      // Shard groups of consecutive ranks; replicas join the ranks at the same index.
      const int Z = w.size / replicas;
      MPI_Comm zc, rc;
      MPI_Comm_split(MPI_COMM_WORLD, w.rank / Z, w.rank, &zc);
      MPI_Comm_split(MPI_COMM_WORLD, w.rank % Z, w.rank, &rc);
      {
        dist::MpiComm zero(zc, "zero", 60), rep(rc, "zero_replica", 60);
        dist::Comm* replica = replicas > 1 ? &rep : nullptr;
        zero::CommLane lane(*be, {&zero, replica}, queued);
        const int64_t len = (numel + Z - 1) / Z;
        std::vector<ops::Buffer> shards, grads, parts;
        for (int64_t u = 0; u < L; ++u) shards.push_back(be->alloc(DType::F32, len));
        const int nbuf = queued ? 2 : 1;
        for (int k = 0; k < nbuf; ++k) {
          grads.push_back(be->alloc(DType::F32, len * Z));
          parts.push_back(be->alloc(DType::F32, len));
        }
        zero::GradScatter sc(
            *be, lane, zero, replica, std::move(grads), std::move(parts), [&](size_t u) { return shards[u].flat(); },
            [&](size_t) { return len; });
        EXPECT_EQ(static_cast<int>(sc.buffers()), nbuf);
        for (int pass = 0; pass < 2; ++pass) {
          for (size_t u = static_cast<size_t>(L); u-- > 0;) {  // backward order
            const ops::Tensor g = sc.grad(u, numel);
            const std::vector<float> mine = grad_values(seed, w.rank, u, numel, pass);
            std::memcpy(g.ptr<float>(), mine.data(), mine.size() * sizeof(float));
            sc.done(u);
            if (queued && pass == 0 && u == static_cast<size_t>(L - 1)) {
              const float* s = shards[u].flat().ptr<float>();
              for (int64_t i = 0; i < len; ++i) ASSERT_EQ(s[i], 0.f) << "added before its buffer was reused";
            }
          }
          sc.finish();
        }
        // MpiComm sums in rank order within the group, then across the replica groups.
        const int zr = w.rank % Z;
        for (size_t u = 0; u < static_cast<size_t>(L); ++u) {
          std::vector<double> want(static_cast<size_t>(numel), 0.0);
          for (int pass = 0; pass < 2; ++pass) {
            std::vector<float> across(static_cast<size_t>(numel), 0.f);
            for (int rg = 0; rg < replicas; ++rg) {
              std::vector<float> in_group(static_cast<size_t>(numel), 0.f);
              for (int r = 0; r < Z; ++r) {
                const std::vector<float> c = grad_values(seed, rg * Z + r, u, numel, pass);
                for (size_t e = 0; e < c.size(); ++e) in_group[e] += c[e];
              }
              for (size_t e = 0; e < in_group.size(); ++e) across[e] += in_group[e];
            }
            for (size_t e = 0; e < across.size(); ++e) want[e] += static_cast<double>(across[e]);
          }
          const float* s = shards[u].flat().ptr<float>();
          for (int64_t i = 0; i < len; ++i) {
            const int64_t e = zr * len + i;
            const double expect = e < numel ? want[static_cast<size_t>(e)] : 0.0;  // (the padding stays 0)
            ASSERT_NEAR(s[i], expect, 1e-5 * (1 + std::abs(expect))) << "unit " << u << " element " << e;
          }
        }
      }
      MPI_Comm_free(&zc);
      MPI_Comm_free(&rc);
    }
}

// The host AdamW on the CPU backend's queues (chunks smaller than a unit, so the staging
// double buffer turns): the bits of the GPU kernel's element update (kernels/adamw_math.h),
// the bf16 working copy equal to the rounded master, each unit complete once its fence is; the
// times it reports for the step's log.
TEST(HostAdamW, UpdatesEachUnitAsTheGpuKernelDoes) {
  std::mt19937_64 rng(test::test_seed());
  auto be = ops::make_cpu_backend();
  const std::vector<int64_t> sizes = {1000, 70001, 5};
  std::vector<std::vector<float>> p, m, v, g, p2, m2, v2;
  std::vector<std::vector<uint16_t>> work;
  std::vector<zero::OffloadPiece> pieces;
  for (size_t u = 0; u < sizes.size(); ++u) {
    const size_t n = static_cast<size_t>(sizes[u]);
    p.push_back(test::random_vector<float>(n, rng));
    m.push_back(test::random_vector<float>(n, rng, -0.01, 0.01));
    v.push_back(test::random_vector<float>(n, rng, 0, 0.01));
    g.push_back(test::random_vector<float>(n, rng));
    work.emplace_back(n, 0);
  }
  p2 = p, m2 = m, v2 = v;
  for (size_t u = 0; u < sizes.size(); ++u) {
    zero::OffloadPiece pc;
    pc.master = p[u].data();
    pc.m = m[u].data();
    pc.v = v[u].data();
    pc.grad_dev = g[u].data();
    pc.work_dev = work[u].data();
    pc.n = sizes[u];
    pc.weight_decay = u == 1 ? 0.0 : 0.1;
    pc.unit = u;
    pieces.push_back(pc);
  }
  const ops::AdamWStep s{1e-3, 0.9, 0.95, 1e-8, 0.0, 3};
  zero::HostAdamW adamw(*be, 4096);  // (after the arrays: its thread is joined before they go)
  adamw.start(pieces, s, 2);
  for (size_t u = 0; u < sizes.size(); ++u) {
    adamw.wait_unit(u).host_wait();
    const kernels::AdamWConsts k = kernels::adamw_consts(s.lr, s.beta1, s.beta2, s.eps, pieces[u].weight_decay, s.step);
    for (size_t i = 0; i < p2[u].size(); ++i) kernels::adamw_element(p2[u][i], g[u][i], m2[u][i], v2[u][i], k);
    ASSERT_EQ(std::memcmp(p[u].data(), p2[u].data(), p[u].size() * 4), 0) << "master of unit " << u;
    ASSERT_EQ(std::memcmp(m[u].data(), m2[u].data(), m[u].size() * 4), 0) << "m of unit " << u;
    ASSERT_EQ(std::memcmp(v[u].data(), v2[u].data(), v[u].size() * 4), 0) << "v of unit " << u;
    for (size_t i = 0; i < p[u].size(); ++i) ASSERT_EQ(work[u][i], ops::float_to_bf16(p[u][i])) << u << " " << i;
  }
  adamw.finish();
  EXPECT_FALSE(adamw.pending());
  // Its times (the step's report): one step over every element, its waits counted; then none.
  const zero::HostAdamWTimes t = adamw.take_times();
  EXPECT_EQ(t.steps, 1);
  EXPECT_EQ(t.elements, 1000 + 70001 + 5);
  EXPECT_GT(t.seconds, 0.0);
  EXPECT_GE(t.waited, 0.0);
  EXPECT_DOUBLE_EQ(t.gb_per_s(), 30.0 * 71006 / t.seconds / 1e9);
  const zero::HostAdamWTimes none = adamw.take_times();
  EXPECT_EQ(none.steps, 0);
  EXPECT_EQ(none.seconds, 0.0);
  EXPECT_EQ(none.gb_per_s(), 0.0);
  adamw.step(pieces, s);  // (start + finish: the caller waits for all of it)
  const zero::HostAdamWTimes sync = adamw.take_times();
  EXPECT_EQ(sync.steps, 1);
  EXPECT_GE(sync.waited, sync.seconds) << "a synchronous step is exposed whole";
}
