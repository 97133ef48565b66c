// Shared main for every test binary: MPI is initialised (singleton when run without mpirun),
// only rank 0 prints GoogleTest's results, and a failure on any rank fails the test on every
// rank (the exit code is reduced over the world).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ::testing::InitGoogleTest(&argc, argv);
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
