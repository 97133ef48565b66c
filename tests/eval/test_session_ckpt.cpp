// ckpt:DIR models (4 ranks): a ZeRO-3 checkpoint written by 4 ranks is read by one rank alone
// and by groups of 2 (sequence parallel), with the model config from its index; one rank's
// scores are the bits of the forward-only pass on the gathered master weights.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include "dist/comm_mpi.h"
#include "dist/groups.h"
#include "eval/model_source.h"
#include "eval/session.h"
#include "eval_test_util.h"
#include "train/trainer.h"

namespace easyctx::test {
namespace {

TEST(EvalSessionCkpt, Zero3CheckpointOfFourRanksReadByOneAndByTwo) {
  int argc = 0;
  char** argv = nullptr;
  dist::Runtime rt(&argc, &argv);
  if (rt.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  uint64_t seed = 0;
  const std::string path = shared_walk_dir("eval-z3", seed);
  StageConfig c = tiny_stage(path + "/shard.h5", path + "/run");
  c.data.seq_length = 37;
  c.train.seed = seed;
  c.train.steps = 2;
  c.parallel.zero.stage = 3;
  std::vector<std::vector<float>> master;
  {
    const dist::GroupLayout layout = dist::make_group_layout(c, rt.size(), rt.topology().local_size);
    dist::ProcessGroups groups(rt, layout, dist::CommBackend::Mpi, 120);
    train::Trainer t(c, groups);
    t.train_step(0);
    t.train_step(1);
    t.save_checkpoint(2);
    master = t.master_host();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const eval::ModelRef ref = eval::resolve_model("ckpt:" + path + "/run");
  EXPECT_EQ(ref.step, 2);
  const model::LlamaConfig cfg = eval::model_config(ref);
  EXPECT_EQ(cfg.hidden_size, 64);
  EXPECT_EQ(cfg.vocab_size, 256);

  // Requests: two odd lengths, prefix and inner spans.
  std::mt19937_64 rng(seed + 7);
  std::vector<eval::ScoreRequest> reqs(2);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].tokens.resize(i ? 45 : 29);
    for (auto& t : reqs[i].tokens) t = static_cast<int32_t>(rng() % 256);
    reqs[i].spans = {{0, static_cast<int64_t>(reqs[i].tokens.size()) - 1}, {3, 9}};
  }
  // The forward-only pass on the gathered weights, row by row.
  auto be = ops::make_cpu_backend();
  model::ModelOptions mo;
  mo.lm_head_tile = 4096;
  mo.mlp_tile = 16384;
  model::LlamaModel m(cfg, *be, ops::DType::F32, mo);
  std::vector<ops::Tensor> params;
  for (auto& u : master)
    params.emplace_back(u.data(), ops::DType::F32, std::initializer_list<int64_t>{static_cast<int64_t>(u.size())});
  std::vector<std::vector<double>> want(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const int64_t n = static_cast<int64_t>(reqs[i].tokens.size());
    std::vector<int32_t> tok = reqs[i].tokens, pos(static_cast<size_t>(n)), lab(static_cast<size_t>(n), -1);
    for (int64_t t = 0; t + 1 < n; ++t) lab[static_cast<size_t>(t)] = tok[static_cast<size_t>(t + 1)];
    for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t);
    std::vector<double> nll(static_cast<size_t>(n));
    std::vector<int32_t> top(static_cast<size_t>(n));
    model::Batch b{ops::Tensor(tok.data(), ops::DType::I32, {n}), ops::Tensor(pos.data(), ops::DType::I32, {n}),
                   ops::Tensor(lab.data(), ops::DType::I32, {n}), 1, n};
    m.forward_score(params, b, ops::Tensor(nll.data(), ops::DType::F64, {n}),
                    ops::Tensor(top.data(), ops::DType::I32, {n}));
    for (const auto& sp : reqs[i].spans) {
      double s = 0;
      for (int64_t p = sp.begin; p < sp.begin + sp.length; ++p) s += nll[static_cast<size_t>(p)];
      want[i].push_back(s);
    }
  }
  eval::SessionOptions o;
  o.model = "ckpt:" + path + "/run";
  o.device = DeviceKind::Cpu;
  {  // one rank alone (every rank, each on its own)
    dist::MpiComm self(MPI_COMM_SELF, "self", 120);
    const auto got = eval::open_session(o, self)->score_spans(reqs);
    for (size_t i = 0; i < reqs.size(); ++i)
      for (size_t s = 0; s < reqs[i].spans.size(); ++s) EXPECT_EQ(got[i][s].sum_nll, want[i][s]) << i << "/" << s;
  }
  {  // groups of two ranks, sequence parallel
    MPI_Comm pair;
    MPI_Comm_split(MPI_COMM_WORLD, rt.rank() / 2, rt.rank(), &pair);
    {
      dist::MpiComm comm(pair, "pair", 120);
      eval::SessionOptions o2 = o;
      o2.sp_size = 2;
      const auto got = eval::open_session(o2, comm)->score_spans(reqs);
      for (size_t i = 0; i < reqs.size(); ++i)
        for (size_t s = 0; s < reqs[i].spans.size(); ++s) {
          EXPECT_NEAR(got[i][s].sum_nll, want[i][s], 1e-5 * std::abs(want[i][s])) << i << "/" << s;
          EXPECT_EQ(got[i][s].count, reqs[i].spans[s].length);
        }
    }
    MPI_Comm_free(&pair);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rt.rank() == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(path);
}

}  // namespace
}  // namespace easyctx::test
