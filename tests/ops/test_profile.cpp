// The per-op profiler (logging.profile): ProfilingBackend gives bit-identical results to
// the backend it wraps, counts calls and model FLOPs per op and shape, and attention_pairs
// counts exactly the (query, key) pairs a block's mask leaves visible.
#include <cstring>

#include "ops/profile.h"
#include "ops_test_util.h"

namespace easyctx::test {
namespace {

using ops::DType;

double brute_pairs(int64_t sq, int64_t sk, const ops::AttentionBlock& b) {
  double n = 0;
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t j = 0; j < sk; ++j) n += !b.causal || b.k_offset + j <= b.q_offset + i;
  return n;
}

TEST_F(OpsFixture, AttentionPairsCountTheVisiblePairs) {
  for (int it = 0; it < 300; ++it) {
    const int64_t sq = 1 + pick(70), sk = 1 + pick(70);
    ops::AttentionBlock b;
    b.causal = pick(5) != 0;
    b.q_offset = pick(120);
    b.k_offset = pick(120);
    ASSERT_EQ(ops::attention_pairs(sq, sk, b), brute_pairs(sq, sk, b))
        << sq << "x" << sk << " causal " << b.causal << " q_offset " << b.q_offset << " k_offset " << b.k_offset;
  }
  ops::AttentionBlock sq;
  EXPECT_EQ(ops::attention_pairs(1 << 20, 1 << 20, sq), 0.5 * 1048576.0 * 1048577.0);  // 1M causal square
}

TEST_F(OpsFixture, ProfilingBackendForwardsExactlyAndCountsOps) {
  auto prof = std::make_unique<ops::ProfilingBackend>(ops::make_cpu_backend());
  const int64_t m = 37, n = 23, k = 19, S = 29, H = 4, Hk = 2, hd = 8;
  ops::Buffer a = rand(DType::F32, m * k), b = rand(DType::F32, n * k);
  ops::Buffer q = rand(DType::F32, S * H * hd), kk = rand(DType::F32, S * Hk * hd), v = rand(DType::F32, S * Hk * hd);
  ops::AttentionBlock blk;
  blk.scale = 0.3;
  auto run = [&](ops::Backend& be, int reps) {
    std::vector<float> out;
    for (int r = 0; r < reps; ++r) {
      ops::Buffer c = be.alloc(DType::F32, m * n), o = be.alloc(DType::F32, S * H * hd),
                  lse = be.alloc(DType::F32, H * S);
      be.matmul(a.view({m, k}), false, b.view({n, k}), true, c.view({m, n}));
      be.attention_fwd(q.view({1, S, H, hd}), kk.view({1, S, Hk, hd}), v.view({1, S, Hk, hd}), blk,
                       o.view({1, S, H, hd}), lse.view({1, H, S}));
      be.scale(c.flat(), 0.5);
      out.assign(c.flat().ptr<float>(), c.flat().ptr<float>() + m * n);
      out.insert(out.end(), o.flat().ptr<float>(), o.flat().ptr<float>() + S * H * hd);
      out.push_back(static_cast<float>(be.sum_squares(lse.flat())));
    }
    return out;
  };
  const std::vector<float> want = run(*be, 1);
  // Disabled: nothing recorded.
  EXPECT_EQ(std::memcmp(run(*prof, 1).data(), want.data(), want.size() * sizeof(float)), 0);
  prof->collect();
  EXPECT_TRUE(prof->rows().empty());
  // Enabled: the same bits, every call counted under its key with its FLOPs.
  prof->set_enabled(true);
  const std::vector<float> got = run(*prof, 3);
  prof->collect();
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
  std::map<std::string, ops::OpProfileRow> by;
  for (const ops::OpProfileRow& r : prof->rows()) by[r.key] = r;
  const std::string mm = "matmul NT 37x23x19 f32->f32", at = "attention_fwd causal 29x29 4/2x8";
  ASSERT_TRUE(by.count(mm)) << "keys: " << by.begin()->first;
  ASSERT_TRUE(by.count(at));
  EXPECT_EQ(by[mm].calls, 3);
  EXPECT_DOUBLE_EQ(by[mm].flops, 3 * 2.0 * m * n * k);
  EXPECT_EQ(by[at].calls, 3);
  EXPECT_DOUBLE_EQ(by[at].flops, 3 * 4.0 * (S * (S + 1) / 2) * H * hd);
  EXPECT_EQ(by["scale f32"].calls, 3);
  EXPECT_EQ(by["sum_squares f32"].calls, 3);
  for (const auto& [key, r] : by) EXPECT_GE(r.ms, 0) << key;
  EXPECT_GT(prof->total_ms(), 0);
  EXPECT_EQ(&prof->base(), &prof->base().base());  // the inner backend is its own base
}

}  // namespace
}  // namespace easyctx::test
