// Checkpoint/resume through the trainer under mpirun (4 ranks):
//  - each sequence-parallel mode (2 x 2: dp 2 x sp 2): 6 steps straight equal 3 steps, save,
//    a new trainer resuming (--resume auto), 3 more steps: identical losses and weights, bit
//    for bit;
//  - a 4-rank data-parallel checkpoint resumed on 2 and on 3 ranks (same global batch of 12
//    sequences) continues with the 4-rank run's losses to fp32 tolerance;
//  - stage chaining (model.init ckpt:DIR) with fresh or carried Adam moments, each verifying
//    what it loads: damage to the moments stops a carry or a resume, not a fresh start.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <filesystem>

#include "ckpt/ckpt_test_util.h"
#include "ckpt/convert.h"
#include "ckpt/sharded_checkpoint.h"
#include "dist/comm_mpi.h"
#include "dist/groups.h"
#include "train/trainer.h"
#include "train_test_util.h"

namespace easyctx::test {
namespace {

std::vector<float> weights(const train::Trainer& t) {
  std::vector<float> all;
  for (const ops::Tensor& u : t.master()) all.insert(all.end(), u.ptr<float>(), u.ptr<float>() + u.numel());
  return all;
}

class ResumeSp : public ::testing::TestWithParam<SeqParallelMode> {};

TEST_P(ResumeSp, SixStepsEqualThreePlusResumePlusThree) {
  int argc = 0;
  char** argv = nullptr;
  dist::Runtime rt(&argc, &argv);
  if (rt.size() != 4) GTEST_SKIP() << "needs 4 ranks (2 data-parallel x 2 sequence-parallel)";
  uint64_t seed = 0;
  const std::string path = shared_walk_dir(std::string("resume-sp") + to_string(GetParam()), seed);
  StageConfig c = tiny_stage(path + "/shard.h5", path + "/straight");
  c.data.seq_length = 37;
  c.train.seed = seed;
  c.train.steps = 6;
  c.parallel.sequence.mode = GetParam();
  c.parallel.sequence.size = 2;
  c.parallel.sequence.ulysses_size = GetParam() == SeqParallelMode::Usp ? 2 : 0;
  c.activation.checkpoint = CheckpointPolicy::AttentionOutput;
  const dist::GroupLayout layout = dist::make_group_layout(c, rt.size(), rt.topology().local_size);
  dist::ProcessGroups groups(rt, layout, dist::CommBackend::Mpi, 120);
  std::vector<double> straight;
  std::vector<float> w_straight;
  {
    train::Trainer t(c, groups);
    for (int64_t s = 0; s < 6; ++s) straight.push_back(t.train_step(s).loss);
    w_straight = weights(t);
  }
  StageConfig r = c;
  r.output.dir = path + "/resumed";
  std::vector<double> resumed;
  {
    train::Trainer t(r, groups);
    ASSERT_EQ(t.start_step(), 0);
    for (int64_t s = 0; s < 3; ++s) resumed.push_back(t.train_step(s).loss);
    t.save_checkpoint(3);
  }
  {
    train::Trainer t(r, groups);  // --resume auto: picks step 3 up
    ASSERT_EQ(t.start_step(), 3);
    for (int64_t s = 3; s < 6; ++s) resumed.push_back(t.train_step(s).loss);
    const std::vector<float> w = weights(t);
    ASSERT_EQ(w.size(), w_straight.size());
    EXPECT_EQ(std::memcmp(w.data(), w_straight.data(), w.size() * sizeof(float)), 0) << "weights differ";
  }
  for (size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(resumed[i], straight[i]) << "step " << i;  // bitwise
  MPI_Barrier(MPI_COMM_WORLD);
  if (rt.rank() == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(path);
}

INSTANTIATE_TEST_SUITE_P(Modes, ResumeSp,
                         ::testing::Values(SeqParallelMode::ZigzagRing, SeqParallelMode::Ulysses,
                                           SeqParallelMode::DistFlash, SeqParallelMode::Usp));

TEST(Resume, FourRankCheckpointOnTwoAndThreeRanks) {
  int argc = 0;
  char** argv = nullptr;
  dist::Runtime rt(&argc, &argv);
  if (rt.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  uint64_t seed = 0;
  const std::string path = shared_walk_dir("resume-reshard", seed);
  StageConfig c = tiny_stage(path + "/shard.h5", path + "/four");
  c.train.seed = seed;
  c.train.steps = 6;
  c.train.batch_size = 3;  // global batch 12 = 3 x 1 x 4 = 3 x 2 x 2 = 2 x 2 x 3
  std::vector<double> four;
  {
    const dist::GroupLayout layout = dist::make_group_layout(c, 4, rt.topology().local_size);
    dist::ProcessGroups groups(rt, layout, dist::CommBackend::Mpi, 120);
    train::Trainer t(c, groups);
    for (int64_t s = 0; s < 3; ++s) t.train_step(s);
    t.save_checkpoint(3);
    for (int64_t s = 3; s < 6; ++s) four.push_back(t.train_step(s).loss);
  }
  for (int n : {2, 3}) {
    // The first n ranks form the smaller job; the others wait.
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, rt.rank() < n ? 0 : MPI_UNDEFINED, rt.rank(), &sub);
    if (sub != MPI_COMM_NULL) {
      dist::MpiComm comm(sub, "sub", 120);
      StageConfig r = c;
      r.train.batch_size = n == 2 ? 3 : 2;  // 3 x 2 x 2 = 2 x 2 x 3 = 12 sequences
      r.train.grad_accum = 2;
      train::RunOptions opts;
      opts.resume = path + "/four";  // resume from the 4-rank run's checkpoint
      r.output.dir = path + "/on" + std::to_string(n);
      train::Trainer t(r, comm, comm, opts);
      EXPECT_EQ(t.start_step(), 3);
      for (int64_t s = 3; s < 6; ++s) {
        const double loss = t.train_step(s).loss;
        EXPECT_NEAR(loss, four[static_cast<size_t>(s - 3)], 1e-5 * four[static_cast<size_t>(s - 3)])
            << n << " ranks, step " << s;
      }
      if (n == 2) {  // a resume with other data settings is refused, naming what changed
        StageConfig bad = r;
        bad.train.seed = r.train.seed + 1;
        bad.output.dir = path + "/bad";
        try {
          train::Trainer tb(bad, comm, comm, opts);
          ADD_FAILURE() << "a resume with another seed was accepted";
        } catch (const InputError& e) { EXPECT_NE(std::string(e.what()).find("seed"), std::string::npos) << e.what(); }
      }
      MPI_Comm_free(&sub);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (rt.rank() == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(path);
}

}  // namespace
}  // namespace easyctx::test

namespace easyctx::test {
namespace {

// Runs body(comm, path, seed) on rank 0 alone (a communicator of that rank only, a fresh walk
// shard in `path`); whatever happens there, every rank meets at the barrier at the end, and the
// folder is removed when the test has not failed.
template <typename Body>
void on_rank0_alone(const std::string& name, Body body) {
  int argc = 0;
  char** argv = nullptr;
  dist::Runtime rt(&argc, &argv);
  uint64_t seed = 0;
  const std::string path = shared_walk_dir(name, seed);
  MPI_Comm solo;
  MPI_Comm_split(MPI_COMM_WORLD, rt.rank() == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
  if (solo != MPI_COMM_NULL) try {
      dist::MpiComm comm(solo, "solo", 120);
      body(comm, path, seed);
      if (!::testing::Test::HasFailure()) std::filesystem::remove_all(path);
    } catch (const std::exception& e) { ADD_FAILURE() << e.what(); }
  if (solo != MPI_COMM_NULL) MPI_Comm_free(&solo);
  MPI_Barrier(MPI_COMM_WORLD);
}

// Stage chaining: model.init ckpt:DIR starts from another run's weights with fresh Adam
// moments, or carries them with model.carry_optimizer; a weights-only checkpoint (from
// easyctx_convert) cannot carry them.
TEST(Resume, StageChainingFreshOrCarriedOptimizer) {
  on_rank0_alone("resume-chain", [](dist::MpiComm& comm, const std::string& path, uint64_t seed) {
    StageConfig a = tiny_stage(path + "/shard.h5", path + "/a");
    a.train.seed = seed;
    {
      train::Trainer t(a, comm, comm);
      for (int64_t s = 0; s < 3; ++s) t.train_step(s);
      t.save_checkpoint(3);
    }
    StageConfig fresh = a, carry = a;
    fresh.model.init = carry.model.init = "ckpt:" + path + "/a";
    fresh.model.rope_theta = carry.model.rope_theta = 50000;  // the next stage's theta
    fresh.output.dir = path + "/fresh";
    carry.output.dir = path + "/carry";
    carry.model.carry_optimizer = true;
    train::Trainer tf(fresh, comm, comm), tc(carry, comm, comm);
    EXPECT_EQ(tf.start_step(), 0);
    EXPECT_EQ(tc.start_step(), 0);
    EXPECT_EQ(tf.master_host(), tc.master_host());  // the same starting weights
    EXPECT_DOUBLE_EQ(tf.model().config().rope_theta, 50000);
    tf.train_step(0);
    tc.train_step(0);
    EXPECT_NE(tf.master_host(), tc.master_host()) << "carried Adam moments must change the first update";
    // A weights-only checkpoint (no Adam state) cannot carry them.
    StageConfig w = carry;
    w.model.init = "ckpt:" + path + "/weights";
    w.output.dir = path + "/w";
    ckpt::ConvertOptions co;
    co.from = "ckpt:" + path + "/a";
    co.to = "hf:" + path + "/hf";
    ckpt::convert_model(co);
    co.from = "hf:" + path + "/hf";
    co.to = "ckpt:" + path + "/weights";
    ckpt::convert_model(co);
    try {
      train::Trainer tw(w, comm, comm);
      ADD_FAILURE() << "carry_optimizer from a weights-only checkpoint was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("weights only"), std::string::npos) << e.what();
    }
  });
}

// model.init ckpt:DIR without model.carry_optimizer verifies (as it reads) the weights only: a
// flipped bit in the source's Adam moments does not stop it, while carrying the moments or
// resuming that run refuses the checkpoint, naming the file and the dataset; a flipped bit in a
// weight refuses it for every use.
TEST(Resume, StageChainingVerifiesWhatItLoads) {
  on_rank0_alone("resume-chain-verify", [](dist::MpiComm& comm, const std::string& path, uint64_t seed) {
    StageConfig a = tiny_stage(path + "/shard.h5", path + "/a");
    a.train.seed = seed;
    std::vector<std::vector<float>> w_a;
    std::string unit;
    {
      train::Trainer t(a, comm, comm);
      for (int64_t s = 0; s < 2; ++s) t.train_step(s);
      t.save_checkpoint(2);
      w_a = t.master_host();
      unit = t.model().layout().units().back().name;
    }
    const std::string step_dir = path + "/a/checkpoints/" + ckpt::step_dir_name(2);
    const std::string file = step_dir + "/rank-00000.h5";
    auto damage = [&](ckpt::ArrayKind kind) {  // a flipped bit in `unit`'s array of that kind: the message
      const std::string name = ckpt::array_name(kind, unit);
      const int slice = slice_of(step_dir, 0, name);
      EXPECT_GE(slice, 0) << name;
      flip_bit(file, slice);
      return file + ": slice_" + std::to_string(slice) + " (" + name + ") fails its checksum";
    };
    auto refusal = [&](const StageConfig& c) { return input_error_of([&] { train::Trainer t(c, comm, comm); }); };
    StageConfig fresh = a, carry = a;
    fresh.model.init = carry.model.init = "ckpt:" + path + "/a";
    fresh.output.dir = path + "/fresh";
    carry.output.dir = path + "/carry";
    carry.model.carry_optimizer = true;

    const std::string moment = damage(ckpt::ArrayKind::AdamV);
    {
      train::Trainer t(fresh, comm, comm);  // (only the weights are read, and they are intact)
      EXPECT_EQ(t.master_host(), w_a);
    }
    const std::string carried = refusal(carry);
    EXPECT_NE(carried.find(moment), std::string::npos) << carried;
    const std::string resumed = refusal(a);  // (--resume auto of run a itself)
    EXPECT_NE(resumed.find("no checkpoint there passes verification"), std::string::npos) << resumed;
    EXPECT_NE(resumed.find(moment), std::string::npos) << resumed;

    const std::string weight = damage(ckpt::ArrayKind::Master);
    fresh.output.dir = path + "/fresh-again";
    const std::string refused = refusal(fresh);
    EXPECT_NE(refused.find("model.init: ckpt:" + path + "/a"), std::string::npos) << refused;
    EXPECT_NE(refused.find(weight), std::string::npos) << refused;
  });
}

}  // namespace
}  // namespace easyctx::test
