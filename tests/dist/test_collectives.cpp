// Every collective of the Comm backends, in every process group of several layouts, against
// values computed independently from (world rank, index). Values are small multiples of
// 1/8 so float sums are exact. Built twice: MPI (host buffers, 3 and 4 ranks) and NCCL
// (device buffers, label gpu, skipped without a GPU).
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "core/config.h"
#include "core/error.h"
#include "dist/groups.h"
#include "test_util.h"
#ifdef EASYCTX_TEST_NCCL
#include <cuda_runtime.h>
#endif

using namespace easyctx;
using dist::Comm;
using dist::DType;
using dist::ReduceOp;

namespace {

uint64_t g_salt = 0;

// The value rank `r` contributes at index i, in [-64, 64) step 1/8.
double value(int r, size_t i, int variant) {
  uint64_t h =
      (static_cast<uint64_t>(r) * 1000003ull + i * 7919ull + static_cast<uint64_t>(variant) * 104729ull) ^ g_salt;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  return static_cast<double>(static_cast<int64_t>(h % 1024) - 512) / 8.0;
}

// value() scaled to integers for integral types, so every type sees exact expectations.
template <typename T>
double val(int r, size_t i, int v) {
  double x = value(r, i, v);
  return std::is_integral<T>::value ? x * 8 : x;
}

// Buffers in the comm's memory space, filled/read through host vectors.
template <typename T>
struct Buf {
  std::vector<T> host;
  void* dev = nullptr;
  bool device;
  Buf(size_t n, bool on_device) : host(n), device(on_device) {
#ifdef EASYCTX_TEST_NCCL
    if (device) { EXPECT_EQ(cudaMalloc(&dev, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess); }
#endif
  }
  ~Buf() {
#ifdef EASYCTX_TEST_NCCL
    if (dev) cudaFree(dev);
#endif
  }
  T* ptr() { return device ? static_cast<T*>(dev) : host.data(); }
  void upload() {
#ifdef EASYCTX_TEST_NCCL
    if (device) {
      EXPECT_EQ(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
#endif
  }
  void download(Comm& c) {
    c.synchronize();
#ifdef EASYCTX_TEST_NCCL
    if (device) {
      EXPECT_EQ(cudaMemcpy(host.data(), dev, host.size() * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    }
#else
    (void)c;
#endif
  }
  void poison() {
    for (auto& x : host) x = static_cast<T>(-12345);
    upload();
  }
};

template <typename T>
void check_group(Comm& c, const std::vector<int>& members, size_t n, int variant) {
  const bool dev = c.memspace() == dist::MemSpace::Device;
  const int me = members[static_cast<size_t>(c.rank())];
  const int P = c.size();
  ASSERT_EQ(static_cast<size_t>(P), members.size());
  auto mine = [&](size_t i, int v) { return static_cast<T>(val<T>(me, i, v)); };

  // all_reduce: sum, max, min; out of place and in place.
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
    int v = variant + static_cast<int>(op);
    Buf<T> s(n, dev), r(n, dev);
    for (size_t i = 0; i < n; ++i) s.host[i] = mine(i, v);
    s.upload();
    r.poison();
    c.all_reduce(s.ptr(), r.ptr(), n, dist::dtype_of<T>(), op);
    r.download(c);
    for (size_t i = 0; i < n; ++i) {
      double e = op == ReduceOp::Sum ? 0 : val<T>(members[0], i, v);
      for (int m : members) {
        double x = val<T>(m, i, v);
        e = op == ReduceOp::Sum ? e + x : op == ReduceOp::Max ? std::max(e, x) : std::min(e, x);
      }
      ASSERT_EQ(static_cast<double>(r.host[i]), e) << c.name() << " all_reduce op " << int(op) << " i=" << i;
    }
  }
  {
    Buf<T> s(n, dev);
    for (size_t i = 0; i < n; ++i) s.host[i] = mine(i, variant + 5);
    s.upload();
    c.all_reduce(s.ptr(), n);
    s.download(c);
    for (size_t i = 0; i < n; ++i) {
      double e = 0;
      for (int m : members) e += val<T>(m, i, variant + 5);
      ASSERT_EQ(static_cast<double>(s.host[i]), e) << c.name() << " in-place all_reduce i=" << i;
    }
  }
  // reduce_scatter: block r of the sum.
  {
    Buf<T> s(n * static_cast<size_t>(P), dev), r(n, dev);
    for (size_t i = 0; i < s.host.size(); ++i) s.host[i] = mine(i, variant + 6);
    s.upload();
    r.poison();
    c.reduce_scatter(s.ptr(), r.ptr(), n);
    r.download(c);
    for (size_t i = 0; i < n; ++i) {
      double e = 0;
      for (int m : members) e += val<T>(m, static_cast<size_t>(c.rank()) * n + i, variant + 6);
      ASSERT_EQ(static_cast<double>(r.host[i]), e) << c.name() << " reduce_scatter i=" << i;
    }
  }
  // all_gather: out of place and in place (own block of recv).
  for (bool in_place : {false, true}) {
    Buf<T> s(n, dev), r(n * static_cast<size_t>(P), dev);
    for (size_t i = 0; i < n; ++i) s.host[i] = mine(i, variant + 7);
    s.upload();
    r.poison();
    if (in_place) {
      for (size_t i = 0; i < n; ++i) r.host[static_cast<size_t>(c.rank()) * n + i] = mine(i, variant + 7);
      r.upload();
      c.all_gather(r.ptr() + static_cast<size_t>(c.rank()) * n, r.ptr(), n);
    } else {
      c.all_gather(s.ptr(), r.ptr(), n);
    }
    r.download(c);
    for (int j = 0; j < P; ++j)
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(static_cast<double>(r.host[static_cast<size_t>(j) * n + i]),
                  val<T>(members[static_cast<size_t>(j)], i, variant + 7))
            << c.name() << " all_gather block " << j << " i=" << i << " in_place=" << in_place;
  }
  // broadcast from every root.
  for (int root = 0; root < P; ++root) {
    Buf<T> b(n, dev);
    for (size_t i = 0; i < n; ++i) b.host[i] = mine(i, variant + 8 + root);
    b.upload();
    c.broadcast(b.ptr(), n, root);
    b.download(c);
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(static_cast<double>(b.host[i]), val<T>(members[static_cast<size_t>(root)], i, variant + 8 + root))
          << c.name() << " broadcast root " << root;
  }
  // send_recv around the ring, both directions.
  for (int dir : {1, -1}) {
    Buf<T> s(n, dev), r(n, dev);
    for (size_t i = 0; i < n; ++i) s.host[i] = mine(i, variant + 20);
    s.upload();
    r.poison();
    int dst = (c.rank() + dir + P) % P, src = (c.rank() - dir + P) % P;
    c.send_recv(s.ptr(), n, dst, r.ptr(), n, src);
    r.download(c);
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(static_cast<double>(r.host[i]), val<T>(members[static_cast<size_t>(src)], i, variant + 20))
          << c.name() << " send_recv dir " << dir;
  }
  // all_to_all: block i of recv is block me of rank i's send.
  {
    Buf<T> s(n * static_cast<size_t>(P), dev), r(n * static_cast<size_t>(P), dev);
    for (size_t i = 0; i < s.host.size(); ++i) s.host[i] = mine(i, variant + 30);
    s.upload();
    r.poison();
    c.all_to_all(s.ptr(), r.ptr(), n);
    r.download(c);
    for (int j = 0; j < P; ++j)
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(static_cast<double>(r.host[static_cast<size_t>(j) * n + i]),
                  val<T>(members[static_cast<size_t>(j)], static_cast<size_t>(c.rank()) * n + i, variant + 30))
            << c.name() << " all_to_all from " << j << " i=" << i;
  }
  EXPECT_EQ(c.all_reduce_scalar(static_cast<double>(me), ReduceOp::Max),
            static_cast<double>(*std::max_element(members.begin(), members.end())));
  c.barrier();
}

void check_layout(const StageConfig& cfg) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int argc = 0;
  char** argv = nullptr;
  dist::Runtime rt(&argc, &argv);
  dist::GroupLayout L;
  try {
    L = dist::make_group_layout(cfg, world, rt.topology().local_size);
  } catch (const InputError&) { GTEST_SKIP() << "layout does not fit " << world << " ranks"; }
#ifdef EASYCTX_TEST_NCCL
  auto backend = dist::CommBackend::Nccl;
#else
  auto backend = dist::CommBackend::Mpi;
#endif
  dist::ProcessGroups pg(rt, L, backend, 120.0);
  auto find = [&](const std::vector<std::vector<int>>& gs) {
    for (auto& g : gs)
      if (std::find(g.begin(), g.end(), rt.rank()) != g.end()) return g;
    return std::vector<int>{};
  };
  std::mt19937_64 rng(test::test_seed());
  // Same salt on every rank.
  uint64_t salt = rng();
  MPI_Bcast(&salt, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  g_salt = salt;
  std::vector<int> world_members(static_cast<size_t>(world));
  std::iota(world_members.begin(), world_members.end(), 0);
  struct G {
    Comm* c;
    std::vector<int> m;
  };
  std::vector<G> groups = {{&pg.world(), world_members},
                           {&pg.dp(), find(L.dp_groups())},
                           {&pg.sp(), find(L.sp_groups())},
                           {&pg.ulysses(), find(L.ulysses_groups())},
                           {&pg.ring(), find(L.ring_groups())},
                           {&pg.zero(), find(L.zero_groups())},
                           {&pg.zero_replica(), find(L.zero_replica_groups())}};
  int variant = 0;
  for (auto& g : groups)
    for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{65537}}) {
      check_group<float>(*g.c, g.m, n, variant += 100);
      if (g.c->memspace() == dist::MemSpace::Host) check_group<double>(*g.c, g.m, n, variant += 100);
      check_group<int64_t>(*g.c, g.m, n, variant += 100);
      if (::testing::Test::HasFatalFailure()) return;
    }
}

bool have_device() {
#ifdef EASYCTX_TEST_NCCL
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return true;
#endif
}

}  // namespace

class Collectives : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device on this machine: NCCL collectives not run";
  }
};

TEST_F(Collectives, DataParallelOnly) {
  StageConfig c;
  check_layout(c);
}

TEST_F(Collectives, SequenceParallelTwo) {
  StageConfig c;
  c.parallel.sequence.mode = SeqParallelMode::ZigzagRing;
  c.parallel.sequence.size = 2;
  check_layout(c);
}

TEST_F(Collectives, UspWithZeroPerNode) {
  StageConfig c;
  c.parallel.sequence.mode = SeqParallelMode::Usp;
  c.parallel.sequence.size = 4;
  c.parallel.sequence.ulysses_size = 2;
  c.parallel.zero.group = ZeroGroupScope::Node;
  check_layout(c);
}

TEST_F(Collectives, WholeWorldSequenceParallel) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  StageConfig c;
  c.parallel.sequence.mode = SeqParallelMode::Ulysses;
  c.parallel.sequence.size = world;
  check_layout(c);
}

TEST_F(Collectives, BFloat16MovesAsRawWords) {
  int argc = 0;
  char** argv = nullptr;
  dist::Runtime rt(&argc, &argv);
  StageConfig cfg;
  auto L = dist::make_group_layout(cfg, rt.size(), rt.topology().local_size);
#ifdef EASYCTX_TEST_NCCL
  dist::ProcessGroups pg(rt, L, dist::CommBackend::Nccl, 120.0);
#else
  dist::ProcessGroups pg(rt, L, dist::CommBackend::Mpi, 120.0);
#endif
  Comm& c = pg.world();
  const size_t n = 333;
  bool dev = c.memspace() == dist::MemSpace::Device;
  Buf<uint16_t> s(n, dev), r(n * static_cast<size_t>(c.size()), dev);
  for (size_t i = 0; i < n; ++i) s.host[i] = static_cast<uint16_t>((rt.rank() * 977 + i * 31) & 0xFFFF);
  s.upload();
  c.all_gather(s.ptr(), r.ptr(), n, DType::BF16);
  r.download(c);
  for (int j = 0; j < c.size(); ++j)
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(r.host[static_cast<size_t>(j) * n + i], static_cast<uint16_t>((j * 977 + i * 31) & 0xFFFF));
  if (!dev) { EXPECT_THROW(c.all_reduce(s.ptr(), s.ptr(), n, DType::BF16, ReduceOp::Sum), Error); }
}
