// The evaluation programs' libraries under mpirun (4 ranks): every sequence-parallel mode
// (zigzag_ring, ulysses, dist_flash, usp over 4 ranks; 2 data-parallel groups x 2; 4
// data-parallel groups) gives what one rank alone gives, for easyctx_eval_ppl's sweep (every
// length's documents and mean NLL, 1e-5) and easyctx_eval_needle's (every cell of the needle
// and the four synthetic tasks: its count, answer tokens and answer NLL, 1e-5), on prompt
// lengths that are no multiple of anything (the session pads inside, where nothing reads it).
// Data parallelism alone (the needle's cells spread over the groups) gives the same bits.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>

#include "dist/comm_mpi.h"
#include "eval/needle.h"
#include "eval/perplexity.h"
#include "eval_test_util.h"
#include "needle_test_util.h"

namespace easyctx::test {
namespace {

// The CI tokenizer's vocabulary, GQA (4 query heads over 2 key/value heads), two layers.
model::LlamaConfig sp_test_config() {
  model::LlamaConfig c = eval_test_config();
  c.vocab_size = 2000;
  return c;
}

struct Fixture {
  uint64_t seed = 0;
  std::string dir;
};

// A random model (std 0.3) as an HF folder and a shard of walk documents (vocabulary 2000),
// shared by every rank.
Fixture make_fixture(const std::string& tag) {
  Fixture f;
  f.dir = shared_dir(tag, f.seed, [&](const std::string& d) {
    HostModel hm(sp_test_config(), f.seed);
    ckpt::save_hf_model(d + "/model", hm.cfg, hm.m->layout(), hm.params);
    write_walk_shard(d + "/shard.h5", f.seed, 8, 130, 150, 2000);
  });
  return f;
}

void cleanup(const Fixture& f) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(f.dir);
}

// (mode, sp size, ulysses size)
using Layout = std::tuple<SeqParallelMode, int, int>;
class EvalSp : public ::testing::TestWithParam<Layout> {};

std::string layout_name(const ::testing::TestParamInfo<Layout>& i) {
  const auto [mode, sp, u] = i.param;
  return std::string(to_string(mode)) + "_sp" + std::to_string(sp) + (u ? "_u" + std::to_string(u) : "");
}

TEST_P(EvalSp, PerplexityEqualsOneRank) {
  const auto [mode, sp, ulysses] = GetParam();
  const Fixture f = make_fixture("evalsp-ppl");
  eval::PplOptions o;
  o.model_dir = f.dir + "/model";
  o.tokenized = {f.dir + "/shard.h5"};
  o.min_tokens = 17;
  o.max_tokens = 129;
  o.tokens_step = 16;
  o.samples = 3;
  o.lm_head_tile = 7;
  o.mlp_tile = 16;
  o.collective_timeout_s = 120;
  const std::vector<eval::PplRow> one = eval::evaluate_perplexity(o, nullptr);
  o.sp_mode = mode;
  o.sp_size = sp;
  o.ulysses_size = ulysses;
  int rounds = 0;
  o.progress = [&](const eval::ScoreProgress&) { ++rounds; };
  dist::MpiComm world(MPI_COMM_WORLD, "world", 120);
  const std::vector<eval::PplRow> got = eval::evaluate_perplexity(o, &world);
  ASSERT_EQ(got.size(), one.size());
  ASSERT_EQ(one.size(), 8u);  // 17, 33, ..., 129
  EXPECT_GT(rounds, 0);
  double worst = 0;
  int scored = 0;
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(got[i].tokens, one[i].tokens);
    EXPECT_EQ(got[i].documents, one[i].documents) << "L " << one[i].tokens;
    if (one[i].documents == 0) continue;
    ++scored;
    worst = std::max(worst, std::abs(got[i].mean_nll - one[i].mean_nll) / std::abs(one[i].mean_nll));
    if (sp == 1) {
      EXPECT_EQ(got[i].mean_nll, one[i].mean_nll) << "L " << one[i].tokens << ": data parallelism alone";
    } else {
      EXPECT_NEAR(got[i].mean_nll, one[i].mean_nll, 1e-5 * std::abs(one[i].mean_nll)) << "L " << one[i].tokens;
    }
  }
  EXPECT_EQ(scored, 8);
  std::printf("[accuracy] ppl %s sp %d: %d lengths, worst mean-NLL rel err %.3g (tol %s)\n", to_string(mode), sp,
              scored, worst, sp == 1 ? "0" : "1e-5");
  cleanup(f);
}

TEST_P(EvalSp, NeedleSweepEqualsOneRank) {
  const auto [mode, sp, ulysses] = GetParam();
  const Fixture f = make_fixture("evalsp-needle");
  eval::NeedleOptions o;
  o.session.model = f.dir + "/model";
  o.session.device = DeviceKind::Cpu;
  o.session.lm_head_tile = 5;
  o.session.mlp_tile = 16;
  o.session.collective_timeout_s = 120;
  o.tokenizer = demo_tokenizer();
  o.output_dir = f.dir + "/out";  // (run_sweep writes nothing)
  o.tasks = {eval::Task::Needle, eval::Task::Passkey, eval::Task::MultiKey, eval::Task::MultiValue,
             eval::Task::VariableTracking};
  o.min_context = 61;
  o.max_context = 151;
  o.context_interval = 90;
  o.depth_interval = 1;
  o.samples = 2;
  o.seed = f.seed;
  o.task.digits = 5;
  o.task.distractors = 1;
  o.task.keys = 3;
  o.task.values = 2;
  o.task.hops = 2;
  const auto tok = data::load_tokenizer(o.tokenizer);
  const eval::PromptBuilder b(*tok, o.task);
  const std::vector<uint32_t> hay = tok->encode(haystack_text(f.seed, 100));
  dist::MpiComm self(MPI_COMM_SELF, "self", 120);
  const eval::SweepResult one = eval::run_sweep(o, b, hay, *eval::open_session(o.session, self));
  o.session.sp_mode = mode;
  o.session.sp_size = sp;
  o.session.ulysses_size = ulysses;
  dist::MpiComm world(MPI_COMM_WORLD, "world", 120);
  eval::SweepRelay relay;
  eval::SessionOptions so = o.session;
  so.progress = relay.callback();
  const auto s = eval::open_session(so, world);
  int in_call = 0, calls = 0;
  const eval::SweepResult got = eval::run_sweep(
      o, b, hay, *s,
      [&](const eval::SweepProgress&, const std::vector<eval::CellResult>& finished) {
        ++(finished.empty() ? in_call : calls);
      },
      &relay);
  ASSERT_EQ(one.cells.size(), 2u * 2u + 2u * 4u);
  ASSERT_EQ(got.cells.size(), one.cells.size());
  EXPECT_EQ(calls, 2);  // one per length: every cell of a length shared by the data-parallel groups
  EXPECT_GT(in_call, 0);
  EXPECT_EQ(got.tokens, one.tokens);
  double worst = 0;
  for (size_t i = 0; i < one.cells.size(); ++i) {
    const eval::CellResult &a = one.cells[i], &g = got.cells[i];
    const std::string where =
        std::string(eval::task_name(a.task)) + " L=" + std::to_string(a.context) + " depth " + std::to_string(a.depth);
    EXPECT_EQ(g.task, a.task) << where;
    EXPECT_EQ(g.context, a.context) << where;
    EXPECT_EQ(std::isnan(g.depth) ? -1.0 : g.depth, std::isnan(a.depth) ? -1.0 : a.depth) << where;
    EXPECT_EQ(g.samples, a.samples) << where;
    EXPECT_EQ(g.correct, a.correct) << where;
    EXPECT_EQ(g.answer_tokens, a.answer_tokens) << where;
    EXPECT_GT(a.answer_tokens, 0) << where;
    worst = std::max(worst, std::abs(g.answer_nll - a.answer_nll) / std::abs(a.answer_nll));
    if (sp == 1) {
      EXPECT_EQ(g.answer_nll, a.answer_nll) << where << ": data parallelism alone";
    } else {
      EXPECT_NEAR(g.answer_nll, a.answer_nll, 1e-5 * std::abs(a.answer_nll)) << where;
    }
  }
  std::printf("[accuracy] needle %s sp %d: %zu cells, worst answer-NLL rel err %.3g (tol %s)\n", to_string(mode), sp,
              one.cells.size(), worst, sp == 1 ? "0" : "1e-5");
  cleanup(f);
}

INSTANTIATE_TEST_SUITE_P(All, EvalSp,
                         ::testing::Values(Layout{SeqParallelMode::ZigzagRing, 4, 0},
                                           Layout{SeqParallelMode::Ulysses, 4, 0},
                                           Layout{SeqParallelMode::DistFlash, 4, 0}, Layout{SeqParallelMode::Usp, 4, 2},
                                           Layout{SeqParallelMode::ZigzagRing, 2, 0},
                                           Layout{SeqParallelMode::ZigzagRing, 1, 0}),
                         layout_name);

}  // namespace
}  // namespace easyctx::test
