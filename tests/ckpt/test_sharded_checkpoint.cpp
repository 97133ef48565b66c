// Sharded checkpoints under mpirun: every rank saves its slices, any rank reads any range
// back (resharding), keep_last prunes, corrupt, truncated or missing files are named, and a
// verification of the weights alone ignores damage to the Adam moments only.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <array>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "ckpt/ckpt_test_util.h"
#include "ckpt/rank_sync.h"
#include "ckpt/sharded_checkpoint.h"
#include "core/error.h"
#include "test_util.h"

using namespace easyctx;
namespace fs = std::filesystem;

namespace {
int rank_() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int size_() {
  int s;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
// A shared temporary folder (rank 0 creates it).
std::string shared_tmp() {
  std::string dir;
  if (rank_() == 0)
    dir = fs::temp_directory_path().string() + "/easyctx_ckpt_" + std::to_string(test::test_seed() % 1000000007);
  int len = static_cast<int>(dir.size());
  MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
  dir.resize(static_cast<size_t>(len));
  MPI_Bcast(dir.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank_() == 0) fs::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}
// Global array value at index i of array `salt` at step `step`.
float value(int64_t i, int salt, int64_t step) {
  return static_cast<float>(std::sin(static_cast<double>(i) * 0.37 + salt) * 100.0 + static_cast<double>(step));
}
// Saves arrays "w/a" (n_a) and "w/b" (n_b) split evenly (rank r holds [r*n/W, (r+1)*n/W)).
std::string save(const std::string& root, int64_t step, int64_t n_a, int64_t n_b, int keep,
                 const ckpt::WriterOptions& opts = {}, bool* skipped = nullptr) {
  const int W = size_(), r = rank_();
  ckpt::CheckpointWriter w(MPI_COMM_WORLD, root, step, opts);
  std::vector<float> a(static_cast<size_t>(n_a)), b(static_cast<size_t>(n_b));
  for (int64_t i = 0; i < n_a; ++i) a[static_cast<size_t>(i)] = value(i, 1, step);
  for (int64_t i = 0; i < n_b; ++i) b[static_cast<size_t>(i)] = value(i, 2, step);
  auto lo = [&](int64_t n) { return n * r / W; };
  auto hi = [&](int64_t n) { return n * (r + 1) / W; };
  w.add("w/a", n_a, lo(n_a), a.data() + lo(n_a), hi(n_a) - lo(n_a));
  w.add("w/b", n_b, lo(n_b), b.data() + lo(n_b), hi(n_b) - lo(n_b));
  Json meta = Json::object();
  meta.set("rank", r);
  meta.set("cursor", step * 10 + r);
  w.set_rank_meta(meta);
  Json index_meta = Json::object();
  index_meta.set("model", "test");
  const std::string dir = w.commit(index_meta, keep);
  if (skipped) *skipped = w.skipped();
  return dir;
}
ckpt::WriterOptions run(const std::string& id) {
  ckpt::WriterOptions o;
  o.run_id = id;
  o.timeout_s = 60;
  return o;
}
std::string run_of(const std::string& dir) { return ckpt::CheckpointReader(dir).run_id(); }
}  // namespace

TEST(ShardedCheckpoint, SaveReadReshardPrune) {
  const std::string root = shared_tmp();
  const int W = size_();
  std::mt19937_64 rng(test::test_seed());
  int64_t n_a = 1000 + static_cast<int64_t>(rng() % 1000);
  const int64_t n_b = 5;  // fewer elements than some runs have ranks: empty slices
  MPI_Bcast(&n_a, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  std::string dir = save(root, 5, n_a, n_b, 2);
  EXPECT_EQ(dir, root + "/step-00000005");
  ckpt::CheckpointReader rd(dir);
  EXPECT_EQ(rd.step(), 5);
  EXPECT_EQ(rd.world_size(), W);
  EXPECT_EQ(rd.numel("w/a"), n_a);
  EXPECT_EQ(rd.meta().at("model").as_string(), "test");
  // Read the whole array, then a range that spans every file boundary differently.
  std::vector<float> a(static_cast<size_t>(n_a));
  rd.read("w/a", 0, n_a, a.data());
  for (int64_t i = 0; i < n_a; ++i) ASSERT_EQ(a[static_cast<size_t>(i)], value(i, 1, 5)) << i;
  int64_t off = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(n_a / 2)), len = n_a / 3;
  std::vector<float> part(static_cast<size_t>(len));
  rd.read("w/a", off, len, part.data());
  for (int64_t i = 0; i < len; ++i) ASSERT_EQ(part[static_cast<size_t>(i)], value(off + i, 1, 5));
  std::vector<float> b(static_cast<size_t>(n_b));
  rd.read("w/b", 0, n_b, b.data());
  for (int64_t i = 0; i < n_b; ++i) ASSERT_EQ(b[static_cast<size_t>(i)], value(i, 2, 5));
  for (int r = 0; r < W; ++r) EXPECT_EQ(rd.rank_meta(r).at("cursor").as_int(), 50 + r);
  EXPECT_NO_THROW(rd.verify());
  EXPECT_THROW(rd.numel("w/missing"), InputError);

  // Two more saves with keep_last 2: step 5 is pruned, `latest` names step 7.
  save(root, 6, n_a, n_b, 2);
  save(root, 7, n_a, n_b, 2);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_FALSE(fs::exists(root + "/step-00000005"));
  EXPECT_TRUE(fs::exists(root + "/step-00000006"));
  std::ifstream latest(root + "/latest");
  std::string l;
  latest >> l;
  EXPECT_EQ(l, "step-00000007");
  auto ref = ckpt::find_latest_checkpoint(root, nullptr);
  EXPECT_EQ(ref.step, 7);
  MPI_Barrier(MPI_COMM_WORLD);

  // Corrupt a value inside step 7's last rank file: verification names the file and falls
  // back to step 6.
  if (rank_() == 0) {
    std::string f = root + "/step-00000007/rank-" + std::string(5 - std::to_string(W - 1).size(), '0') +
                    std::to_string(W - 1) + ".h5";
    hid_t h = H5Fopen(f.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(h, 0);
    hid_t ds = H5Dopen2(h, "slice_0", H5P_DEFAULT);
    float bad[3] = {1e30f, -1e30f, 3.0f};
    hid_t fspace = H5Dget_space(ds);
    hsize_t start = 0, count = 3;
    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, nullptr, &count, nullptr);
    hid_t mspace = H5Screate_simple(1, &count, nullptr);
    ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, bad), 0);
    H5Sclose(mspace);
    H5Sclose(fspace);
    H5Dclose(ds);
    H5Fclose(h);
    std::vector<std::string> warnings;
    auto fb = ckpt::find_latest_checkpoint(root, &warnings);
    EXPECT_EQ(fb.step, 6);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_NE(warnings[0].find("step-00000007"), std::string::npos) << warnings[0];
    EXPECT_NE(warnings[0].find("checksum"), std::string::npos) << warnings[0];

    // Truncate step 6's rank-0 file: named with its sizes. Remove a file: named as missing.
    std::string f6 = root + "/step-00000006/rank-00000.h5";
    fs::resize_file(f6, fs::file_size(f6) / 2);
    try {
      ckpt::CheckpointReader bad6(root + "/step-00000006");
      FAIL() << "truncated file accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("rank-00000.h5 has"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
    }
    fs::remove(root + "/step-00000007/rank-00000.h5");
    try {
      ckpt::CheckpointReader bad7(root + "/step-00000007");
      FAIL() << "missing file accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("rank-00000.h5 is missing"), std::string::npos) << e.what();
    }
    EXPECT_EQ(ckpt::find_latest_checkpoint(root, nullptr).step, -1);
    fs::remove_all(root);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Run identity (ckpt/run_folder.h): pruning keeps only the saving run's checkpoints and never
// touches another run's; another run's checkpoint at the step being saved is set aside, not
// deleted; a step this run has committed and that verifies is not written again; a broken one
// is replaced only after the new one is written, and set aside.
TEST(ShardedCheckpoint, RunIdentityPruneSkipAndSetAside) {
  const std::string root = shared_tmp();
  const int64_t n_a = 777, n_b = 3;
  for (int64_t s : {1, 2, 3}) save(root, s, n_a, n_b, 2, run("A"));
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_FALSE(fs::exists(root + "/step-00000001"));
  // Run B's first checkpoint (step 1, the lowest in the folder) survives its own commit and
  // prunes nothing of run A.
  save(root, 1, n_a, n_b, 1, run("B"));
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank_() == 0) {
    EXPECT_EQ(run_of(root + "/step-00000001"), "B");
    EXPECT_EQ(run_of(root + "/step-00000002"), "A");
    EXPECT_EQ(run_of(root + "/step-00000003"), "A");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // B saves step 2, where A has one: A's is set aside; B's step 1 is pruned (keep_last 1).
  save(root, 2, n_a, n_b, 1, run("B"));
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank_() == 0) {
    EXPECT_EQ(run_of(root + "/step-00000002"), "B");
    EXPECT_EQ(run_of(root + "/aside/A/checkpoints/step-00000002"), "A");
    EXPECT_NO_THROW(ckpt::CheckpointReader(root + "/aside/A/checkpoints/step-00000002").verify());
    EXPECT_FALSE(fs::exists(root + "/step-00000001"));
    EXPECT_EQ(run_of(root + "/step-00000003"), "A");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // The same step again (a stop request right after a save): kept, not written again.
  bool skipped = false;
  const auto mtime = fs::last_write_time(root + "/step-00000002/index.json");
  save(root, 2, n_a, n_b, 1, run("B"), &skipped);
  EXPECT_TRUE(skipped);
  EXPECT_EQ(fs::last_write_time(root + "/step-00000002/index.json"), mtime);
  {
    ckpt::RankSync sync(MPI_COMM_WORLD, 60, "test");
    EXPECT_EQ(ckpt::verify_collectively(sync, root + "/step-00000002"), "");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // A broken copy of this run's step is written again; the broken one is set aside.
  if (rank_() == 0) fs::resize_file(root + "/step-00000002/rank-00000.h5", 100);
  MPI_Barrier(MPI_COMM_WORLD);
  {
    ckpt::RankSync sync(MPI_COMM_WORLD, 60, "test");
    const std::string problem = ckpt::verify_collectively(sync, root + "/step-00000002");
    EXPECT_NE(problem.find("rank-00000.h5 has 100 bytes"), std::string::npos) << problem;  // on every rank
  }
  save(root, 2, n_a, n_b, 1, run("B"), &skipped);
  EXPECT_FALSE(skipped);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank_() == 0) {
    EXPECT_NO_THROW(ckpt::CheckpointReader(root + "/step-00000002").verify());
    EXPECT_TRUE(fs::exists(root + "/aside/B-broken/checkpoints/step-00000002"));
    std::vector<float> a(static_cast<size_t>(n_a));
    ckpt::CheckpointReader(root + "/step-00000002").read("w/a", 0, n_a, a.data());
    for (int64_t i = 0; i < n_a; ++i) ASSERT_EQ(a[static_cast<size_t>(i)], value(i, 1, 2));
    fs::remove_all(root);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// VerifyScope::Weights (evaluation, easyctx_convert, model.init without carry_optimizer) reads
// and checks the master weights only: a flipped bit in an Adam moment does not make it refuse
// the checkpoint, while a full verification (what a resume does) still does; a flipped bit in a
// weight fails both, naming the file and the dataset; a truncated file fails both.
TEST(ShardedCheckpoint, WeightsScopeChecksOnlyTheWeights) {
  const std::string root = shared_tmp();
  const int W = size_(), r = rank_();
  uint64_t seed = test::test_seed();
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  std::mt19937_64 rng(seed);  // (the same draws on every rank)
  // Two units as a store writes them: master weights, Adam m and v, each split over the ranks.
  const std::pair<std::string, int64_t> units[] = {{"embed", 2000 + static_cast<int64_t>(rng() % 1000)},
                                                   {"layer.0", 300 + static_cast<int64_t>(rng() % 100)}};
  const ckpt::ArrayKind kinds[] = {ckpt::ArrayKind::Master, ckpt::ArrayKind::AdamM, ckpt::ArrayKind::AdamV};
  std::deque<std::vector<float>> arrays;  // (a deque: the writer keeps pointers into them)
  int64_t weight_elems = 0;
  {
    ckpt::CheckpointWriter w(MPI_COMM_WORLD, root, 3, run("E"));
    for (const auto& [unit, n] : units) {
      weight_elems += n;
      for (ckpt::ArrayKind kind : kinds) {
        arrays.push_back(test::random_vector(static_cast<size_t>(n), rng));
        const int64_t lo = n * r / W, hi = n * (r + 1) / W;
        w.add(ckpt::array_name(kind, unit), n, lo, arrays.back().data() + lo, hi - lo);
      }
    }
    w.commit(Json::object(), 1);
  }
  const std::string dir = root + "/" + ckpt::step_dir_name(3);
  auto rank_file = [&](int f) {
    char name[32];
    std::snprintf(name, sizeof name, "/rank-%05d.h5", f);
    return dir + name;
  };
  // Verifies collectively in `scope`: the verdict, and the datasets and bytes the world checked.
  auto verify = [&](ckpt::VerifyScope scope) {
    const uint64_t d0 = ckpt::verified_dataset_count(), b0 = ckpt::verified_byte_count();
    ckpt::RankSync sync(MPI_COMM_WORLD, 60, "test");
    const std::string problem = ckpt::verify_collectively(sync, dir, nullptr, scope);
    std::array<uint64_t, 2> mine{ckpt::verified_dataset_count() - d0, ckpt::verified_byte_count() - b0}, all{};
    MPI_Allreduce(mine.data(), all.data(), 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    return std::make_pair(problem, all);
  };

  // Intact: both pass; the weights' verification reads a third of the datasets and bytes.
  const auto full = verify(ckpt::VerifyScope::Everything);
  const auto weights = verify(ckpt::VerifyScope::Weights);
  EXPECT_EQ(full.first, "");
  EXPECT_EQ(weights.first, "");
  EXPECT_EQ(full.second[0], 6u * static_cast<uint64_t>(W));  // (every slice holds elements)
  EXPECT_EQ(weights.second[0], 2u * static_cast<uint64_t>(W));
  EXPECT_EQ(full.second[1], 3u * static_cast<uint64_t>(weight_elems) * sizeof(float));
  EXPECT_EQ(weights.second[1], static_cast<uint64_t>(weight_elems) * sizeof(float));

  // A flipped bit in an Adam moment of the last file: the weights still verify (and read back
  // as written); the full verification names the file and the dataset, on every rank alike.
  const std::string moment = ckpt::array_name(ckpt::ArrayKind::AdamM, "layer.0");
  const int m_slice = test::slice_of(dir, W - 1, moment);
  ASSERT_GE(m_slice, 0);
  MPI_Barrier(MPI_COMM_WORLD);
  if (r == 0) test::flip_bit(rank_file(W - 1), m_slice);
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string m_msg =
      rank_file(W - 1) + ": slice_" + std::to_string(m_slice) + " (" + moment + ") fails its checksum";
  EXPECT_EQ(verify(ckpt::VerifyScope::Weights).first, "");
  const std::string m_problem = verify(ckpt::VerifyScope::Everything).first;
  EXPECT_NE(m_problem.find(m_msg), std::string::npos) << m_problem;
  if (r == 0) {
    const ckpt::CheckpointReader rd(dir);
    EXPECT_NO_THROW(rd.verify(ckpt::VerifyScope::Weights));
    EXPECT_NE(test::input_error_of([&] { rd.verify(); }).find(m_msg), std::string::npos);
    std::vector<float> got(static_cast<size_t>(units[1].second));
    rd.read(ckpt::array_name(ckpt::ArrayKind::Master, "layer.0"), 0, units[1].second, got.data());
    EXPECT_EQ(got, arrays[3]);  // (layer.0's master weights)
  }

  // A flipped bit in a weight of the first file: both refuse, naming the file and the dataset.
  const std::string weight = ckpt::array_name(ckpt::ArrayKind::Master, "embed");
  const int w_slice = test::slice_of(dir, 0, weight);
  ASSERT_GE(w_slice, 0);
  MPI_Barrier(MPI_COMM_WORLD);
  if (r == 0) test::flip_bit(rank_file(0), w_slice);
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string w_msg =
      rank_file(0) + ": slice_" + std::to_string(w_slice) + " (" + weight + ") fails its checksum";
  for (ckpt::VerifyScope scope : {ckpt::VerifyScope::Weights, ckpt::VerifyScope::Everything}) {
    const std::string problem = verify(scope).first;
    EXPECT_NE(problem.find(w_msg), std::string::npos) << problem;
    if (r == 0) {
      const std::string alone = test::input_error_of([&] { ckpt::CheckpointReader(dir).verify(scope); });
      EXPECT_NE(alone.find(w_msg), std::string::npos) << alone;
    }
  }

  // The files' presence and sizes are checked whatever the scope.
  MPI_Barrier(MPI_COMM_WORLD);
  if (r == 0) fs::resize_file(rank_file(W - 1), 100);
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string cut = verify(ckpt::VerifyScope::Weights).first;
  EXPECT_NE(cut.find(fs::path(rank_file(W - 1)).filename().string() + " has 100 bytes"), std::string::npos) << cut;
  MPI_Barrier(MPI_COMM_WORLD);
  if (r == 0 && !::testing::Test::HasFailure()) fs::remove_all(root);
  MPI_Barrier(MPI_COMM_WORLD);
}
