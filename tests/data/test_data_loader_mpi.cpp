// Loader across real MPI ranks: data-parallel ranks together see the same global batch as
// one rank with gradient accumulation, and zigzag slices of the SP ranks reassemble the
// sequence each rank would see unsliced.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <set>

#include "data/loader.h"
#include "data_test_util.h"
#include "test_util.h"

using namespace easyctx;
using namespace easyctx::data;

namespace {
int world_rank() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// Rank 0 writes a random shard; every rank gets its path and the seed.
struct SharedShard {
  std::unique_ptr<easyctx::test::ScratchDir> dir;
  std::string path;
  uint64_t seed = 0;
};
SharedShard make_shared_shard() {
  SharedShard s;
  char buf[512] = {};
  uint64_t seed = 0;
  if (world_rank() == 0) {
    std::mt19937_64 rng(easyctx::test::test_seed());
    s.dir = std::make_unique<easyctx::test::ScratchDir>("mpi-loader");
    s.path = *s.dir / "s.h5";
    easyctx::test::write_random_shard(s.path, rng, 200, 300, 32000);
    std::snprintf(buf, sizeof buf, "%s", s.path.c_str());
    seed = rng();
  }
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  s.path = buf;
  s.seed = seed;
  return s;
}

std::vector<int32_t> allgather(const std::vector<int32_t>& v) {
  std::vector<int32_t> out(v.size() * world_size());
  MPI_Allgather(v.data(), static_cast<int>(v.size()), MPI_INT32_T, out.data(), static_cast<int>(v.size()), MPI_INT32_T,
                MPI_COMM_WORLD);
  return out;
}
}  // namespace

TEST(DataLoaderMpi, DataParallelRanksShareTheGlobalBatch) {
  SharedShard sh = make_shared_shard();
  const int P = world_size();
  LoaderOptions o;
  o.path = sh.path;
  o.seq_length = 37;
  o.seed = sh.seed;
  o.shape = {2, 1, P};
  o.dp_rank = world_rank();
  DataLoader dp(o);
  LoaderOptions single = o;
  single.shape = {2, P, 1};
  single.dp_rank = 0;
  DataLoader accum(single);
  for (int64_t step : {0, 3, 11}) {
    std::vector<int32_t> mine = dp.micro_batch(step, 0).tokens;
    std::vector<int32_t> all = allgather(mine);
    std::vector<int32_t> expect;
    for (int m = 0; m < P; ++m) {
      auto t = accum.micro_batch(step, m).tokens;
      expect.insert(expect.end(), t.begin(), t.end());
    }
    EXPECT_EQ(all, expect) << "step " << step;
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(DataLoaderMpi, ZigzagSlicesReassembleTheSequence) {
  SharedShard sh = make_shared_shard();
  const int W = world_size();
  LoaderOptions o;
  o.path = sh.path;
  o.seq_length = 4 * W * 5 + 3;  // not a multiple of 2W: exercises padding
  o.seed = sh.seed;
  o.sp_layout = SpLayout::Zigzag;
  o.sp_size = W;
  o.sp_rank = world_rank();
  DataLoader sliced(o);
  LoaderOptions whole = o;
  whole.sp_layout = SpLayout::None;
  whole.sp_size = 1;
  whole.sp_rank = 0;
  DataLoader full(whole);
  MicroBatch mb = sliced.micro_batch(2, 0);
  MicroBatch ref = full.micro_batch(2, 0);
  auto tok = allgather(mb.tokens), lab = allgather(mb.labels), pos = allgather(mb.positions);
  std::vector<int32_t> t(tok.size(), -9), l(tok.size(), -9);
  for (size_t i = 0; i < pos.size(); ++i) {
    t[pos[i]] = tok[i];
    l[pos[i]] = lab[i];
  }
  int64_t L = o.seq_length, real = 0;
  for (int64_t p = 0; p < L; ++p) {
    EXPECT_EQ(t[p], ref.tokens[p]);
    EXPECT_EQ(l[p], ref.labels[p]);
  }
  for (size_t p = L; p < t.size(); ++p) EXPECT_EQ(l[p], -1);
  MPI_Allreduce(&mb.real_labels, &real, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(real, L);
  MPI_Barrier(MPI_COMM_WORLD);
}
