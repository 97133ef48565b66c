// The evaluation programs' reads under mpirun (2 and 3 ranks): what every rank needs is read
// once and shared.
//  * The needle haystack: rank 0 reads and tokenizes it and broadcasts the ids; every rank
//    holds exactly what a load of its own would give (the KJV, a folder repeated to length);
//    the other ranks read nothing (they are handed a folder that does not exist); a bad file
//    ends every rank with the same message and type.
//  * Checkpoint verification (ckpt:DIR): each file's datasets are checked by one rank, not by
//    every rank, and only the weights (the master arrays the evaluation loads): a flipped bit
//    in an Adam moment of the newest checkpoint leaves it in use (a resume's full verification
//    refuses it), one in its weights makes every rank fall back to the same older one with the
//    same warning; when none verifies, every rank throws the same InputError naming the file,
//    the dataset and both checksums.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "ckpt/ckpt_test_util.h"
#include "ckpt/rank_sync.h"
#include "ckpt/run_folder.h"
#include "ckpt/sharded_checkpoint.h"
#include "core/strings.h"
#include "dist/comm_mpi.h"
#include "dist/runtime.h"
#include "eval/haystack.h"
#include "eval/model_source.h"
#include "eval_test_util.h"
#include "needle_test_util.h"

namespace easyctx::test {
namespace {

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Rank 0's string on every rank (to compare each rank's with it).
std::string rank0s(const std::string& mine) {
  uint64_t n = mine.size();
  MPI_Bcast(&n, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  std::string s = mine;
  s.resize(n);
  MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD);
  return s;
}

// What `fn` threw on this rank: {type ("input", "error", "none"), message}.
template <typename F>
std::pair<std::string, std::string> outcome(F fn) {
  try {
    fn();
  } catch (const InputError& e) { return {"input", e.what()}; } catch (const std::exception& e) {
    return {"error", e.what()};
  }
  return {"none", ""};
}

// ---- the haystack ----------------------------------------------------------------------

class Rank0Haystack : public ::testing::Test {
 protected:
  void SetUp() override {
    if (world_size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or more";
    tok_ = data::load_tokenizer(demo_tokenizer());
  }
  std::unique_ptr<data::Tokenizer> tok_;
  dist::MpiComm world_{MPI_COMM_WORLD, "world", 120};
};

TEST_F(Rank0Haystack, BroadcastEqualsALocalLoadOnEveryRank) {
  uint64_t seed = 0;
  // Two text files and a JSON Lines file, fewer tokens than asked: read in order, repeated.
  const std::string dir = shared_dir("rank0-hay", seed, [](const std::string& d) {
    std::filesystem::create_directories(d + "/hay/sub");
    write_file_atomic(d + "/hay/a.txt", haystack_text(test_seed() + 1, 120));
    auto line = [](std::string text) {  // (the text's paragraph breaks as JSON escapes)
      std::string out = "{\"text\": \"";
      for (char c : text) out += c == '\n' ? std::string("\\n") : std::string(1, c);
      return out + "\"}\n";
    };
    write_file_atomic(d + "/hay/sub/b.jsonl", line(haystack_text(7, 20)) + line(haystack_text(8, 20)));
    write_file_atomic(d + "/hay/c.txt", haystack_text(9, 50));
  });
  for (int root : {0, world_size() - 1}) {
    for (const int64_t want : {int64_t{300}, int64_t{20000}}) {
      SCOPED_TRACE("root " + std::to_string(root) + ", " + std::to_string(want) + " tokens");
      const eval::Haystack local = eval::load_haystack(dir + "/hay", *tok_, want);
      // Only the root is given the folder: the others must not read anything, they get the ids.
      const std::string spec = world_.rank() == root ? dir + "/hay" : dir + "/not-there";
      const eval::Haystack shared = eval::load_haystack(spec, *tok_, want, world_, root);
      ASSERT_EQ(shared.tokens.size(), local.tokens.size());
      EXPECT_TRUE(shared.tokens == local.tokens) << "rank " << world_.rank() << ": the ids differ";
      EXPECT_EQ(shared.description, local.description);
      EXPECT_GE(static_cast<int64_t>(shared.tokens.size()), want);
      if (want == 20000) { EXPECT_NE(shared.description.find("repeated to"), std::string::npos) << shared.description; }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_.rank() == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(dir);
}

TEST_F(Rank0Haystack, DefaultKjvBroadcastEqualsALocalLoad) {
  // scripts/setup.sh installs bible-kjv: its absence is a failure, as in test_eval_needle_cli.
  ASSERT_FALSE(eval::kjv_text().empty()) << "`bible` (Debian's bible-kjv) is not installed";
  const eval::Haystack local = eval::load_haystack("", *tok_, 5000);
  const eval::Haystack shared = eval::load_haystack("", *tok_, 5000, world_);
  EXPECT_TRUE(shared.tokens == local.tokens) << "rank " << world_.rank() << ": the KJV ids differ";
  EXPECT_EQ(shared.description, local.description);
  EXPECT_EQ(rank0s(shared.description), shared.description);
}

TEST_F(Rank0Haystack, ABadFileEndsEveryRankAlike) {
  uint64_t seed = 0;
  const std::string dir = shared_dir("rank0-hay-bad", seed, [](const std::string& d) {
    std::filesystem::create_directories(d + "/bad");
    write_file_atomic(d + "/bad/a.txt", haystack_text(3, 10));
    write_file_atomic(d + "/bad/b.jsonl", "{\"text\": \"fine\"}\n{\"text\": broken\n");
    std::filesystem::create_directories(d + "/empty");
    write_file_atomic(d + "/empty/a.txt", "");
  });
  // A JSON line that does not parse (found only while reading): named on every rank alike.
  // 10^6 tokens: more than a.txt holds, so b.jsonl is read.
  const auto bad = outcome([&] { eval::load_haystack(dir + "/bad", *tok_, 1000000, world_); });
  EXPECT_EQ(bad.first, "input") << bad.second;
  EXPECT_NE(bad.second.find("b.jsonl line 2"), std::string::npos) << bad.second;
  EXPECT_EQ(rank0s(bad.second), bad.second) << "rank " << world_.rank() << " has another message";
  // No tokens at all; a folder that is not there (rank 0's view decides).
  for (const std::string& spec : {dir + "/empty", dir + "/nothing"}) {
    const auto got = outcome([&] { eval::load_haystack(spec, *tok_, 100, world_); });
    EXPECT_EQ(got.first, "input") << spec << ": " << got.second;
    EXPECT_NE(got.second.find("--haystack-dir " + spec), std::string::npos) << got.second;
    EXPECT_EQ(rank0s(got.second), got.second) << "rank " << world_.rank() << " has another message";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_.rank() == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(dir);
}

// ---- checkpoint verification -----------------------------------------------------------

// What the processes verified during fn, summed over the world: files, datasets, bytes.
struct Verified {
  uint64_t files = 0, datasets = 0, bytes = 0;
};
template <typename F>
Verified verified_by_all(F fn) {
  const uint64_t f0 = ckpt::verified_file_count(), d0 = ckpt::verified_dataset_count(),
                 b0 = ckpt::verified_byte_count();
  fn();
  uint64_t mine[3] = {ckpt::verified_file_count() - f0, ckpt::verified_dataset_count() - d0,
                      ckpt::verified_byte_count() - b0};
  uint64_t all[3] = {0, 0, 0};
  MPI_Allreduce(mine, all, 3, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return {all[0], all[1], all[2]};
}

TEST(Rank0Checkpoint, EachFileVerifiedByOneRankAndTheVerdictShared) {
  const int W = world_size();
  if (W < 2) GTEST_SKIP() << "needs mpirun -np 2 or more";
  int argc = 0;
  char** argv = nullptr;
  dist::Runtime rt(&argc, &argv);  // (MPI is up already: this sets up the watchdog's roll call)
  uint64_t seed = 0;
  const std::string dir = shared_dir("rank0-ckpt", seed, nullptr);
  const std::string root = dir + "/run/checkpoints";
  // Steps 4 and 8, one file per rank, as a store writes them: the master weights and an Adam
  // moment of a unit of 1234 floats (fresh random values), each split over the ranks.
  const std::string weight = ckpt::array_name(ckpt::ArrayKind::Master, "w");
  const std::string moment = ckpt::array_name(ckpt::ArrayKind::AdamM, "w");
  const int64_t n = 1234;
  std::mt19937_64 rng(seed);  // (the same draws on every rank)
  for (int64_t step : {4, 8}) {
    const std::vector<float> a = random_vector(static_cast<size_t>(n), rng);
    const std::vector<float> m = random_vector(static_cast<size_t>(n), rng);
    ckpt::CheckpointWriter w(MPI_COMM_WORLD, root, step);
    const int64_t lo = n * rt.rank() / W, hi = n * (rt.rank() + 1) / W;
    w.add(weight, n, lo, a.data() + lo, hi - lo);
    w.add(moment, n, lo, m.data() + lo, hi - lo);
    w.commit(Json::object(), 3);
  }
  const std::string spec = "ckpt:" + dir + "/run";
  auto file_of = [&](int64_t step, int r) {
    return root + "/" + ckpt::step_dir_name(step) + "/rank-0000" + std::to_string(r) + ".h5";
  };
  auto resolve_in = [&](ckpt::VerifyScope scope, std::vector<std::string>* warnings) {
    ckpt::RankSync sync(MPI_COMM_WORLD, 60, "test");
    return ckpt::resolve_verified(sync, dir + "/run", warnings, scope);
  };

  // Intact: every rank gets step 8, and the world verified its W files once, not W times each;
  // their weights only: one dataset of each file, n floats in all.
  eval::ModelRef ref;
  const Verified shared = verified_by_all([&] { ref = eval::resolve_model(spec, MPI_COMM_WORLD, 60); });
  EXPECT_EQ(shared.files, static_cast<uint64_t>(W));
  EXPECT_EQ(shared.datasets, static_cast<uint64_t>(W));
  EXPECT_EQ(shared.bytes, static_cast<uint64_t>(n) * sizeof(float));
  EXPECT_EQ(ref.step, 8);
  EXPECT_TRUE(ref.checkpoint);
  EXPECT_EQ(rank0s(ref.dir), ref.dir);
  // (A full verification, what a resume does, reads the moments too: twice the bytes.)
  const Verified full = verified_by_all([&] { EXPECT_EQ(resolve_in(ckpt::VerifyScope::Everything, nullptr).step, 8); });
  EXPECT_EQ(full.files, static_cast<uint64_t>(W));
  EXPECT_EQ(full.datasets, 2u * static_cast<uint64_t>(W));
  EXPECT_EQ(full.bytes, 2u * static_cast<uint64_t>(n) * sizeof(float));
  // (One process alone verifies every file: what each rank used to do.)
  EXPECT_EQ(verified_by_all([&] { EXPECT_EQ(eval::resolve_model(spec).step, 8); }).files,
            static_cast<uint64_t>(W) * static_cast<uint64_t>(W));

  // A flipped bit in an Adam moment of step 8's last file: the evaluation still loads step 8
  // (it never reads the moments), with no warning, alone or collectively; a full verification
  // falls back to step 4, naming the file and the dataset.
  MPI_Barrier(MPI_COMM_WORLD);
  if (rt.rank() == 0) flip_bit(file_of(8, W - 1), slice_of(root + "/" + ckpt::step_dir_name(8), W - 1, moment));
  MPI_Barrier(MPI_COMM_WORLD);
  {
    std::vector<std::string> warnings;
    EXPECT_EQ(resolve_in(ckpt::VerifyScope::Weights, &warnings).step, 8);
    EXPECT_TRUE(warnings.empty()) << warnings[0];
    EXPECT_EQ(eval::resolve_model(spec, MPI_COMM_WORLD, 60).step, 8);
    EXPECT_EQ(eval::resolve_model(spec).step, 8);
    const ckpt::CheckpointRef got = resolve_in(ckpt::VerifyScope::Everything, &warnings);
    EXPECT_EQ(got.step, 4);
    ASSERT_EQ(warnings.size(), 1u);
    const std::string m_msg = "rank-0000" + std::to_string(W - 1) + ".h5: slice_1 (" + moment + ") fails its checksum";
    EXPECT_NE(warnings[0].find(m_msg), std::string::npos) << warnings[0];
    EXPECT_EQ(rank0s(warnings[0]), warnings[0]);
  }

  // A flipped bit in step 8's weights (its first file): every rank falls back to step 4 with
  // the same warning, naming the file and the dataset.
  MPI_Barrier(MPI_COMM_WORLD);
  if (rt.rank() == 0) flip_bit(file_of(8, 0), slice_of(root + "/" + ckpt::step_dir_name(8), 0, weight));
  MPI_Barrier(MPI_COMM_WORLD);
  {
    std::vector<std::string> warnings;
    EXPECT_EQ(resolve_in(ckpt::VerifyScope::Weights, &warnings).step, 4);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_NE(warnings[0].find("rank-00000.h5: slice_0 (" + weight + ") fails its checksum"), std::string::npos)
        << warnings[0];
    EXPECT_EQ(rank0s(warnings[0]), warnings[0]);
    EXPECT_EQ(eval::resolve_model(spec, MPI_COMM_WORLD, 60).step, 4);
  }

  // Step 4's weights broken too: every rank throws the same InputError naming the file, the
  // dataset and the checksum found against the one expected; so does the step folder named
  // directly.
  MPI_Barrier(MPI_COMM_WORLD);
  if (rt.rank() == 0) flip_bit(file_of(4, 0), 0);
  MPI_Barrier(MPI_COMM_WORLD);
  for (const std::string& s : {spec, "ckpt:" + root + "/" + ckpt::step_dir_name(4)}) {
    const auto got = outcome([&] { eval::resolve_model(s, MPI_COMM_WORLD, 60); });
    EXPECT_EQ(got.first, "input") << s << ": " << got.second;
    EXPECT_NE(got.second.find("no checkpoint there passes verification"), std::string::npos) << got.second;
    EXPECT_NE(got.second.find(file_of(4, 0) + ": slice_0 (" + weight + ") fails its checksum (CRC32 "),
              std::string::npos)
        << got.second;
    EXPECT_NE(got.second.find(", index.json records "), std::string::npos) << got.second;
    EXPECT_EQ(rank0s(got.second), got.second) << "rank " << rt.rank() << " has another message";
  }
  // Not there at all: the same message on every rank too.
  const auto none = outcome([&] { eval::resolve_model("ckpt:" + dir + "/nothing", MPI_COMM_WORLD, 60); });
  EXPECT_EQ(none.first, "input");
  EXPECT_NE(none.second.find("no such folder"), std::string::npos) << none.second;
  EXPECT_EQ(rank0s(none.second), none.second);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rt.rank() == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace easyctx::test
