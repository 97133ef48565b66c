// Nothing hangs: a rank that stalls before (or dies before, or calls another) collective ends
// the whole job within the collective timeout, with a message naming the operation, the
// group and the rank that never arrived. Runs dist_failure_probe under mpirun (2 ranks) with
// a 2 s timeout and EASYCTX_FAULT (dist/watchdog.h) choosing where rank 1 stalls, for every
// collective of dist::MpiComm, the start-up collectives and the group creation. Each case
// prints its time to a clean exit.
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
// The watchdog's timeout (2 s) plus the roll call (0.5 s), the abort and two launches of mpirun
// on a loaded 2-core machine.
constexpr double kBound = 20.0;

Result run(const std::string& mode, const std::string& fault, const std::string& extra_env = "") {
  // A clean environment: this test process is itself an MPI singleton whose OMPI_* variables
  // would confuse the inner mpirun.
  std::string cmd = std::string("env -i PATH=\"$PATH\" HOME=\"$HOME\" EASYCTX_COLLECTIVE_TIMEOUT_S=2 ") +
                    (fault.empty() ? "" : "'EASYCTX_FAULT=" + fault + "' ") + extra_env + " timeout 90 " +
                    EASYCTX_MPIEXEC + " -np 2 --allow-run-as-root --oversubscribe --bind-to none " + EASYCTX_PROBE +
                    " " + mode + " 2>&1";
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
  std::printf("[ time     ] %s (EASYCTX_FAULT=%s): exit %d after %.1f s\n", mode.c_str(), fault.c_str(), r.status,
              r.seconds);
  return r;
}

void expect_clean_abort(const Result& r) {
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.status, 124) << "hung until the outer timeout:\n" << r.out;
  EXPECT_LT(r.seconds, kBound) << r.out;
}

// Rank 0 waits in `op` on group 'dp'; rank 1 stalled before it: the roll call names rank 1.
void expect_stalled_peer_named(const std::string& op) {
  Result r = run("ops", "stall:1:" + op + ":dp");
  expect_clean_abort(r);
  EXPECT_NE(r.out.find(op + " on group 'dp'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("did not complete within 2 s (parallel.collective_timeout_s) on rank 0"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("rank 1 ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("has not reached it"), std::string::npos) << r.out;
}
}  // namespace

TEST(Hangs, NoFaultRunsEveryCollective) {
  Result r = run("ops", "");
  EXPECT_EQ(r.status, 0) << r.out;
}

TEST(Hangs, StalledPeerInAllReduce) { expect_stalled_peer_named("all_reduce"); }
TEST(Hangs, StalledPeerInReduceScatter) { expect_stalled_peer_named("reduce_scatter"); }
TEST(Hangs, StalledPeerInAllGather) { expect_stalled_peer_named("all_gather"); }
TEST(Hangs, StalledPeerInBroadcast) { expect_stalled_peer_named("broadcast"); }
TEST(Hangs, StalledPeerInSendRecv) { expect_stalled_peer_named("send_recv"); }
TEST(Hangs, StalledPeerInAllToAll) { expect_stalled_peer_named("all_to_all"); }
TEST(Hangs, StalledPeerInBarrier) { expect_stalled_peer_named("barrier"); }
TEST(Hangs, StalledPeerInAllReduceScalar) { expect_stalled_peer_named("all_reduce_scalar"); }

TEST(Hangs, StalledPeerLaterInTheSameOperation) {  // the second all_reduce (integer max) on 'dp'
  Result r = run("ops", "stall:1:all_reduce:dp:2");
  expect_clean_abort(r);
  EXPECT_NE(r.out.find("all_reduce on group 'dp' (1 elements)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1 ("), std::string::npos) << r.out;
}

TEST(Hangs, PeerInAnotherCollectiveIsNamed) {
  Result r = run("mismatch", "");
  expect_clean_abort(r);
  EXPECT_NE(r.out.find("the ranks call collectives in a different order"), std::string::npos) << r.out;
  const bool named = r.out.find("rank 1 (") != std::string::npos &&
                     r.out.find("waits in barrier on group 'world'") != std::string::npos;
  const bool named0 = r.out.find("rank 0 (") != std::string::npos &&
                      r.out.find("waits in all_reduce on group 'dp'") != std::string::npos;
  EXPECT_TRUE(named || named0) << r.out;
}

TEST(Hangs, DeadPeerExitWithoutFinalize) {
  Result r = run("ops", "exit:1:all_gather:dp");
  expect_clean_abort(r);
  EXPECT_NE(r.out.find("rank 1"), std::string::npos) << r.out;
}

TEST(Hangs, DeadPeerKilled) {
  Result r = run("ops", "kill:1:broadcast:dp");
  expect_clean_abort(r);
  EXPECT_NE(r.out.find("rank 1"), std::string::npos) << r.out;
}

TEST(Hangs, PeerThrowsBeforeACollective) {
  Result r = run("ops", "throw:1:barrier:dp");
  expect_clean_abort(r);
  EXPECT_NE(r.out.find("EASYCTX_FAULT: injected failure before barrier on group 'dp'"), std::string::npos) << r.out;
}

TEST(Hangs, StalledPeerDuringStartUp) {  // Runtime's own collectives, before any config
  Result r = run("ops", "stall:1:all_gather(host names):world");
  expect_clean_abort(r);
  EXPECT_NE(r.out.find("all_gather(host names) on group 'world'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1 has not reached it"), std::string::npos) << r.out;
}

TEST(Hangs, StalledPeerInACollectivePhase) {  // run_collectively: loading the config, validating
  Result r = run("collective-phase", "stall:1:run_collectively:world");
  expect_clean_abort(r);
  EXPECT_NE(r.out.find("run_collectively on group 'world'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1 ("), std::string::npos) << r.out;
}

TEST(Hangs, StalledPeerWhileCreatingGroups) {  // MPI_Comm_split: the monitor thread
  Result r = run("ops", "stall:1:create group:dp");
  expect_clean_abort(r);
  EXPECT_NE(r.out.find("MPI_Comm_split (creating the group) on group 'dp'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("did not complete within 2 s (parallel.collective_timeout_s) on rank 0"), std::string::npos)
      << r.out;
}
