// Shared main for every test binary: MPI is initialised (singleton when run without mpirun),
// only rank 0 prints GoogleTest's results, and a failure on any rank fails the test on every
// rank (the exit code is reduced over the world). Under mpirun, --gtest_output=xml:F.xml (or
// GTEST_OUTPUT) becomes F.rank<r>.xml on rank r: one file would be overwritten by every rank,
// and a failure on another rank would not be in it. tests/gtest_run.sh reads them all.
#include <gtest/gtest.h>
#include <mpi.h>

#include "dist/runtime.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {
// "xml:F.xml" -> "xml:F.rank<r>.xml"; anything else unchanged.
std::string per_rank(const std::string& out, int rank) {
  if (out.rfind("xml:", 0) != 0 || out.size() <= 8 || out.compare(out.size() - 4, 4, ".xml") != 0) return out;
  return out.substr(0, out.size() - 4) + ".rank" + std::to_string(rank) + ".xml";
}
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  easyctx::dist::prefer_isolated_singleton();
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  // GoogleTest opens its XML report while parsing the flags: rename before InitGoogleTest.
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> ptrs;
  const std::string flag = "--gtest_output=";
  if (world > 1) {
    if (const char* env = std::getenv("GTEST_OUTPUT")) setenv("GTEST_OUTPUT", per_rank(env, rank).c_str(), 1);
    for (auto& a : args)
      if (a.rfind(flag, 0) == 0) a = flag + per_rank(a.substr(flag.size()), rank);
  }
  for (auto& a : args) ptrs.push_back(a.data());
  ptrs.push_back(nullptr);
  int n = argc;
  ::testing::InitGoogleTest(&n, ptrs.data());
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any != 0 && rc == 0 && rank == 0) std::fprintf(stderr, "a test failed on another rank\n");
  MPI_Finalize();
  return any != 0 ? 1 : 0;
}
