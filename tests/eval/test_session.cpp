// The evaluation session under mpirun (4 ranks): every sequence-parallel mode (zigzag_ring,
// ulysses, dist_flash, usp) over 4 ranks, data x sequence parallelism 2 x 2, and 4
// data-parallel groups give the scores of one rank (NLL sums to 1e-5, the same counts and
// argmax flags; data parallelism alone: the same bits), on odd lengths, overlapping spans,
// empty spans and items with nothing to score; greedy continuations are all argmax.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "dist/comm_mpi.h"
#include "eval/eval_plan.h"
#include "eval/session.h"
#include "eval_test_util.h"

namespace easyctx::test {
namespace {

using eval::ScoreRequest;
using eval::SpanScore;

struct Fixture {
  uint64_t seed = 0;
  std::string dir;
  std::vector<ScoreRequest> requests;
  std::vector<std::pair<size_t, size_t>> greedy_spans;  // (request, span) that must be all argmax
};

Fixture make_fixture(const std::string& tag) {
  Fixture f;
  f.dir = shared_dir(tag, f.seed, [&](const std::string& d) {
    HostModel hm(eval_test_config(), f.seed);
    ckpt::save_hf_model(d + "/model", hm.cfg, hm.m->layout(), hm.params);
  });
  // Every rank builds the same requests (the same seed, the same greedy decoding).
  HostModel hm(eval_test_config(), f.seed);
  std::mt19937_64 rng(f.seed + 1);
  auto rand_tokens = [&](int64_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng() % 101);
    return t;
  };
  auto req = [&](std::vector<int32_t> tokens, std::vector<ScoreRequest::Span> spans) {
    ScoreRequest r;
    r.tokens = std::move(tokens);
    r.spans = std::move(spans);
    f.requests.push_back(std::move(r));
  };
  req(rand_tokens(37), {{0, 36}, {0, 10}, {5, 0}, {30, 6}});  // odd length, prefixes, empty, overlap
  req(rand_tokens(64), {{0, 63}, {20, 10}});
  req(hm.greedy(rand_tokens(19), 4), {{18, 4}, {0, 10}});  // positions 18..21 predict the greedy tokens
  f.greedy_spans.push_back({2, 0});
  req(rand_tokens(5), {{0, 4}});
  req(rand_tokens(50), {});  // nothing to score
  req(hm.greedy(rand_tokens(40), 3), {{39, 3}, {41, 1}});
  f.greedy_spans.push_back({5, 0});
  f.greedy_spans.push_back({5, 1});
  req(rand_tokens(41), {{3, 1}});
  return f;
}

eval::SessionOptions options(const Fixture& f) {
  eval::SessionOptions o;
  o.model = f.dir + "/model";
  o.device = DeviceKind::Cpu;
  o.lm_head_tile = 7;
  o.mlp_tile = 16;
  o.collective_timeout_s = 120;
  return o;
}

// The reference: one rank alone.
std::vector<std::vector<SpanScore>> alone(const Fixture& f) {
  dist::MpiComm self(MPI_COMM_SELF, "self", 120);
  return eval::open_session(options(f), self)->score_spans(f.requests);
}

void expect_same(const std::vector<std::vector<SpanScore>>& got, const std::vector<std::vector<SpanScore>>& want,
                 double tol) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    for (size_t s = 0; s < want[i].size() && s < got[i].size(); ++s)
      worst = std::max(worst,
                       std::abs(got[i][s].sum_nll - want[i][s].sum_nll) / std::max(1.0, std::abs(want[i][s].sum_nll)));
  std::printf("[accuracy] %s: worst span NLL rel err %.3g (tol %.0e)\n",
              ::testing::UnitTest::GetInstance()->current_test_info()->name(), worst, tol);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << "request " << i;
    for (size_t s = 0; s < want[i].size(); ++s) {
      EXPECT_EQ(got[i][s].count, want[i][s].count) << i << "/" << s;
      EXPECT_NEAR(got[i][s].sum_nll, want[i][s].sum_nll, tol * std::max(1.0, std::abs(want[i][s].sum_nll)))
          << i << "/" << s;
      EXPECT_EQ(got[i][s].all_argmax, want[i][s].all_argmax) << i << "/" << s;
    }
  }
}

TEST(EvalSession, OneRankScoresWhatTheModelSays) {
  const Fixture f = make_fixture("session-one");
  const auto ref = alone(f);
  ASSERT_EQ(ref.size(), f.requests.size());
  for (const auto& [i, s] : f.greedy_spans) EXPECT_TRUE(ref[i][s].all_argmax) << i << "/" << s;
  EXPECT_FALSE(ref[1][0].all_argmax);  // 63 random tokens are not all the argmax
  EXPECT_EQ(ref[0][0].count, 36);
  EXPECT_EQ(ref[0][2].count, 0);
  EXPECT_EQ(ref[0][2].sum_nll, 0.0);
  EXPECT_TRUE(ref[0][2].all_argmax);
  EXPECT_TRUE(ref[4].empty());
  // A prefix's NLL sum is the training forward's loss on that prefix (the same bits).
  HostModel hm(eval_test_config(), f.seed);
  for (size_t i : {size_t{0}, size_t{1}}) {
    const ScoreRequest& r = f.requests[i];
    const int64_t n = static_cast<int64_t>(r.tokens.size());
    std::vector<int32_t> tok = r.tokens, pos(static_cast<size_t>(n)), lab(static_cast<size_t>(n), -1);
    for (int64_t t = 0; t < n; ++t) {
      pos[static_cast<size_t>(t)] = static_cast<int32_t>(t);
      if (t + 1 < n) lab[static_cast<size_t>(t)] = tok[static_cast<size_t>(t + 1)];
    }
    model::LlamaModel m(hm.cfg, *hm.be, ops::DType::F32, {CheckpointPolicy::None, 7, 16});
    model::Batch b{ops::Tensor(tok.data(), ops::DType::I32, {n}), ops::Tensor(pos.data(), ops::DType::I32, {n}),
                   ops::Tensor(lab.data(), ops::DType::I32, {n}), 1, n};
    const ops::LossSums ls = m.forward_loss(hm.params, b);
    EXPECT_EQ(ref[i][0].sum_nll, ls.sum_nll) << "request " << i;
    EXPECT_EQ(ref[i][0].count, ls.count);
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(f.dir);
}

// random:SPEC@SEED is init_random's model of that shape (std 0.02): the same scores as the
// HF folder holding those weights.
TEST(EvalSession, RandomModelIsInitRandom) {
  uint64_t seed = 0;
  const std::string dir = shared_dir("session-random", seed, [](const std::string& d) {
    const model::LlamaConfig cfg = eval_test_config();
    const model::ParamLayout layout(cfg);
    std::vector<std::vector<float>> w;
    std::vector<ops::Tensor> v;
    for (const auto& u : layout.units()) {
      w.emplace_back(static_cast<size_t>(u.numel));
      v.emplace_back(w.back().data(), ops::DType::F32, std::initializer_list<int64_t>{u.numel});
    }
    model::init_random(layout, v, 0.02, 5);
    ckpt::save_hf_model(d + "/model", cfg, layout, v);
  });
  eval::ScoreRequest r;
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 40; ++i) r.tokens.push_back(static_cast<int32_t>(rng() % 101));
  r.spans = {{0, 39}, {30, 4}};
  dist::MpiComm self(MPI_COMM_SELF, "self", 120);
  eval::SessionOptions o;
  o.device = DeviceKind::Cpu;
  o.model = dir + "/model";
  const auto want = eval::open_session(o, self)->score_spans({r});
  o.model = "random:" + dir + "/model@5";
  const auto got = eval::open_session(o, self)->score_spans({r});
  expect_same(got, want, 0);
  o.model = "random:" + dir + "/model@6";
  EXPECT_NE(eval::open_session(o, self)->score_spans({r})[0][0].sum_nll, want[0][0].sum_nll);
  o.model = "random:" + dir + "/model@x";
  EXPECT_THROW(eval::open_session(o, self), InputError);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(dir);
}

// (mode, sp size, ulysses size)
class EvalSessionModes : public ::testing::TestWithParam<std::tuple<SeqParallelMode, int, int>> {};

TEST_P(EvalSessionModes, EqualOneRank) {
  const auto [mode, sp, ulysses] = GetParam();
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (world % sp != 0) GTEST_SKIP() << "sp " << sp << " does not divide " << world << " ranks";
  const Fixture f = make_fixture("session-modes");
  const auto ref = alone(f);
  eval::SessionOptions o = options(f);
  o.sp_mode = mode;
  o.sp_size = sp;
  o.ulysses_size = ulysses;
  int rounds = 0;
  eval::ScoreProgress last;
  o.progress = [&](const eval::ScoreProgress& p) {
    ++rounds;
    last = p;
  };
  dist::MpiComm comm(MPI_COMM_WORLD, "world", 120);
  auto s = eval::open_session(o, comm);
  const auto got = s->score_spans(f.requests);
  const int dp = world / sp;
  EXPECT_EQ(rounds, static_cast<int>((f.requests.size() + dp - 1) / dp));
  EXPECT_EQ(last.items_done, static_cast<int64_t>(f.requests.size()));
  EXPECT_EQ(last.tokens_done, last.tokens_total);
  if (sp == 1) {
    expect_same(got, ref, 0);  // data parallelism alone: the same computation, the same bits
  } else {
    expect_same(got, ref, 1e-5);
  }
  for (const auto& [i, sp_i] : f.greedy_spans) EXPECT_TRUE(got[i][sp_i].all_argmax);
  // Twice in a row (the workspace and the batch arrays are reused) gives the same.
  expect_same(s->score_spans(f.requests), got, 0);
  EXPECT_NE(s->describe().find(std::to_string(sp) + " sequence-parallel"), std::string::npos) << s->describe();
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(f.dir);
}

INSTANTIATE_TEST_SUITE_P(All, EvalSessionModes,
                         ::testing::Values(std::make_tuple(SeqParallelMode::ZigzagRing, 4, 0),
                                           std::make_tuple(SeqParallelMode::Ulysses, 4, 0),
                                           std::make_tuple(SeqParallelMode::DistFlash, 4, 0),
                                           std::make_tuple(SeqParallelMode::Usp, 4, 2),
                                           std::make_tuple(SeqParallelMode::ZigzagRing, 2, 0),
                                           std::make_tuple(SeqParallelMode::DistFlash, 2, 0),
                                           std::make_tuple(SeqParallelMode::Ulysses, 2, 0),
                                           std::make_tuple(SeqParallelMode::ZigzagRing, 1, 0)));

// The memory plan of a session (CPU: every backend allocation is planned) equals what the
// session allocated at its peak on the rank that scores the longest item, and bounds the
// others, for data parallel and sequence parallel runs, with and without head groups.
TEST(EvalSession, PlanEqualsTheMeasuredPeak) {
  const Fixture f = make_fixture("session-plan");
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  dist::MpiComm comm(MPI_COMM_WORLD, "world", 120);
  int64_t longest = 0;
  for (const ScoreRequest& r : f.requests) longest = std::max<int64_t>(longest, static_cast<int64_t>(r.tokens.size()));
  for (const auto& [sp, groups] : {std::pair<int, int64_t>{1, 1}, std::pair<int, int64_t>{world, 1},
                                   std::pair<int, int64_t>{world, 2}, std::pair<int, int64_t>{1, 2}}) {
    eval::SessionOptions o = options(f);
    o.sp_size = sp;
    o.attention_head_groups = groups;
    const plan::MemoryPlan p = eval::plan_session(o, longest, {}, world, world);
    auto s = eval::open_session(o, comm);
    s->score_spans(f.requests);
    // Rank 0 scores the longest item (data parallel: the others may see shorter ones only).
    if (rank == 0) {
      EXPECT_EQ(s->stats().alloc_peak_bytes, p.alloc_peak_bytes) << "sp " << sp << ", head groups " << groups << "\n"
                                                                 << plan::format_plan_table(p);
    }
    EXPECT_LE(s->stats().alloc_peak_bytes, p.alloc_peak_bytes) << "sp " << sp << ", head groups " << groups;
    EXPECT_TRUE(p.fits);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(f.dir);
}

TEST(EvalSession, HeadGroupsAndBadInputs) {
  const Fixture f = make_fixture("session-bad");
  const auto ref = alone(f);
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  dist::MpiComm comm(MPI_COMM_WORLD, "world", 120);
  eval::SessionOptions o = options(f);
  o.attention_head_groups = 2;
  o.sp_size = world;
  expect_same(eval::open_session(o, comm)->score_spans(f.requests), ref, 1e-5);
  auto s = eval::open_session(options(f), comm);
  ScoreRequest bad;
  bad.tokens = {1, 2, 3};
  bad.spans = {{1, 2}};  // position 2 has no next token
  try {
    s->score_spans({f.requests[0], bad});
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("request 1 span 0"), std::string::npos) << e.what();
  }
  bad.spans = {{0, 1}};
  bad.tokens[1] = 101;
  EXPECT_THROW(s->score_spans({bad}), InputError);
  eval::SessionOptions no = options(f);
  no.attention_head_groups = 3;
  try {
    eval::open_session(no, comm);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--attention-head-groups"), std::string::npos) << e.what();
  }
  no = options(f);
  no.model = f.dir + "/nothing";
  EXPECT_THROW(eval::open_session(no, comm), InputError);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(f.dir);
}

}  // namespace
}  // namespace easyctx::test
