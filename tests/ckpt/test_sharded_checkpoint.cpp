// Sharded checkpoints under mpirun: every rank saves its slices, any rank reads any range
// back (resharding), keep_last prunes, and corrupt, truncated or missing files are named.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <filesystem>
#include <fstream>
#include <numeric>

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
  if (rank_() == 0) dir = fs::temp_directory_path().string() + "/easyctx_ckpt_" + std::to_string(test::test_seed() % 1000000007);
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
    std::string f = root + "/step-00000007/rank-" + std::string(5 - std::to_string(W - 1).size(), '0') + std::to_string(W - 1) + ".h5";
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
