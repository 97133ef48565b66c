// A failure on any rank ends every rank with one clear message: runs dist_failure_probe
// under mpirun (2 ranks) and checks exit status, message and that nothing hangs.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace {
struct Result {
  int status;
  std::string out;
  double seconds;
};
Result run(const std::string& mode) {
  // A clean environment: this test process is itself an MPI singleton whose OMPI_* variables
  // would confuse the inner mpirun.
  std::string cmd = std::string("env -i PATH=\"$PATH\" HOME=\"$HOME\" timeout 90 ") + EASYCTX_MPIEXEC +
                    " -np 2 --allow-run-as-root --oversubscribe --bind-to none " + EASYCTX_PROBE + " " + mode + " 2>&1";
  auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(cmd.c_str(), "r");
  Result r{-1, "", 0};
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}
size_t count(const std::string& s, const std::string& what) {
  size_t c = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++c;
  return c;
}
}  // namespace

TEST(Failures, StuckPeerTimesOutAndAbortsAll) {
  Result r = run("hang");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.status, 124) << "hung until the outer timeout:\n" << r.out;
  EXPECT_LT(r.seconds, 60.0);
  EXPECT_NE(r.out.find("all_reduce on group 'dp'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("did not complete within 2 s"), std::string::npos) << r.out;
}

TEST(Failures, ExceptionOnOneRankEndsEveryRank) {
  Result r = run("throw-one");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.status, 124) << "hung:\n" << r.out;
  EXPECT_NE(r.out.find("error: boom on rank 1"), std::string::npos) << r.out;
}

TEST(Failures, BadInputOnAllRanksPrintsOnce) {
  Result r = run("bad-input-all");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(count(r.out, "error: stage.yaml:3:5: train.lr: bad value 'x'"), 1u) << r.out;
}

TEST(Failures, BadInputOnOneRankNamesTheRank) {
  Result r = run("bad-input-one");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(count(r.out, "error: rank 1: shard-0001.h5"), 1u) << r.out;
}
