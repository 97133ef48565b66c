// Kill -9 of one rank in the middle of a save, at each point of the commit protocol: the
// previous checkpoint stays the newest committed one and reads back intact, and the next
// save after the crash succeeds and cleans the leftovers.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <filesystem>

#include "ckpt/sharded_checkpoint.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace easyctx;

namespace {
int run_probe(const std::string& root, int64_t step, const std::string& crash) {
  std::string env = crash.empty() ? "" : "EASYCTX_CKPT_CRASH=" + crash + " ";
  std::string cmd = "env -i PATH=\"$PATH\" HOME=\"$HOME\" " + env + "timeout 120 " + EASYCTX_MPIEXEC +
                    " -np 2 --allow-run-as-root --oversubscribe --bind-to none " + EASYCTX_CKPT_PROBE + " " + root +
                    " " + std::to_string(step) + " >/dev/null 2>&1";
  int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
void expect_intact(const std::string& root, int64_t step) {
  auto ref = ckpt::find_latest_checkpoint(root, nullptr);
  ASSERT_EQ(ref.step, step);
  ckpt::CheckpointReader rd(ref.path);
  std::vector<float> a(1234);
  rd.read("w", 0, 1234, a.data());
  for (int64_t i = 0; i < 1234; ++i) ASSERT_EQ(a[static_cast<size_t>(i)], static_cast<float>(std::cos(0.1 * i) + step));
}
}  // namespace

TEST(CheckpointCrash, KillDuringSaveKeepsPrevious) {
  std::string root =
      fs::temp_directory_path().string() + "/easyctx_crash_" + std::to_string(test::test_seed() % 1000003);
  fs::remove_all(root);
  ASSERT_EQ(run_probe(root, 1, ""), 0);
  expect_intact(root, 1);
  int64_t step = 2;
  for (const char* point : {"rank_file:1", "rank_file:0", "before_commit", "before_latest"}) {
    EXPECT_NE(run_probe(root, step, point), 0) << point;
    // before_latest: the new step is committed (only `latest` lags), so it is the newest.
    int64_t expect = std::string(point) == "before_latest" ? step : step - 1;
    expect_intact(root, expect);
    if (expect == step - 1) {
      // The next attempt at the same step succeeds over the leftovers.
      ASSERT_EQ(run_probe(root, step, ""), 0) << point;
      expect_intact(root, step);
    }
    ++step;
  }
  // Every interrupted save's temporary folder was cleaned up by a later successful save.
  for (const auto& e : fs::directory_iterator(root)) EXPECT_NE(e.path().extension(), ".tmp") << e.path();
  fs::remove_all(root);
}
