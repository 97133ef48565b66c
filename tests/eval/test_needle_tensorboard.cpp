// easyctx_eval_needle's TensorBoard events: for a random sweep result, the event file holds per
// context length (the step) each task's accuracy and the needle's accuracy per depth, exactly
// the float32 of what needle.csv and synthetic.csv say (correct / samples, the needle's mean
// over depths in the CSV's order); and end to end (a random demo model, the demo tokenizer) the
// program writes them into <output-dir>/tensorboard, or --tensorboard DIR.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <set>
#include <sstream>

#include "core/strings.h"
#include "eval/needle.h"
#include "tensorboard_test_util.h"
#include "train_test_util.h"

namespace easyctx::test {
namespace {

namespace fs = std::filesystem;
using Expected = std::map<int64_t, std::map<std::string, float>>;

std::string percent(double depth) {
  std::ostringstream os;
  os << std::round(depth * 1000) / 10;
  return os.str();
}

// What the events must hold, from the CSVs alone: score rows give correct = score * samples
// (the score has 4 decimals; samples <= 20 makes the count exact).
Expected expected_from_csvs(const std::string& needle_csv, const std::string& synthetic_csv, const std::string& label) {
  Expected e;
  std::map<int64_t, std::pair<double, int>> needle_sum;
  for (const std::string& line : split(trim(needle_csv), '\n')) {
    const std::vector<std::string> f = split(line, ',');
    if (f[0] == "context") continue;
    const int64_t ctx = std::stoll(f[0]), samples = std::stoll(f[3]);
    const double score = static_cast<double>(std::llround(std::stod(f[2]) * static_cast<double>(samples))) /
                         static_cast<double>(samples);
    e[ctx]["eval_needle/" + label + "/needle_depth_" + percent(std::stod(f[1]))] = static_cast<float>(score);
    needle_sum[ctx].first += score;
    ++needle_sum[ctx].second;
  }
  for (const auto& [ctx, s] : needle_sum)
    e[ctx]["eval_needle/" + label + "/needle"] = static_cast<float>(s.first / s.second);
  for (const std::string& line : split(trim(synthetic_csv), '\n')) {
    const std::vector<std::string> f = split(line, ',');
    if (f[0] == "task") continue;
    const int64_t samples = std::stoll(f[3]);
    const double score = static_cast<double>(std::llround(std::stod(f[2]) * static_cast<double>(samples))) /
                         static_cast<double>(samples);
    e[std::stoll(f[1])]["eval_needle/" + label + "/" + f[0]] = static_cast<float>(score);
  }
  return e;
}

void expect_events(const TbScalars& tb, const Expected& want) {
  ASSERT_EQ(tb.by_step.size(), want.size());
  for (const auto& [ctx, m] : want) {
    ASSERT_EQ(tb.by_step.count(ctx), 1u) << "context " << ctx;
    const auto& t = tb.by_step.at(ctx);
    EXPECT_EQ(t.size(), m.size()) << "context " << ctx;
    for (const auto& [tag, v] : m) {
      ASSERT_EQ(t.count(tag), 1u) << tag;
      EXPECT_EQ(t.at(tag), v) << tag;
    }
  }
}

TEST(NeedleTensorBoard, RandomSweepEventsEqualTheCsvs) {
  const uint64_t seed = test_seed();
  std::mt19937_64 rng(seed);
  eval::SweepResult r;
  const std::vector<eval::Task> tasks{eval::Task::Needle, eval::Task::Passkey, eval::Task::VariableTracking};
  std::set<int64_t> ctxs;
  while (ctxs.size() < 2 + rng() % 3) ctxs.insert(100 * static_cast<int64_t>(1 + rng() % 50));
  const int depths = 2 + static_cast<int>(rng() % 4);
  for (eval::Task t : tasks)
    for (int64_t c : ctxs)
      for (int d = 0; d < (t == eval::Task::Needle ? depths + 1 : 1); ++d) {
        eval::CellResult cell;
        cell.task = t;
        cell.context = c;
        cell.depth = t == eval::Task::Needle ? static_cast<double>(d) / depths : std::nan("");
        cell.samples = 1 + static_cast<int64_t>(rng() % 20);
        cell.correct = static_cast<int64_t>(rng() % static_cast<uint64_t>(cell.samples + 1));
        r.cells.push_back(cell);
      }
  TempDir dir("needle-tb");
  const double t0 = unix_now();
  const std::string path = eval::write_needle_events(dir / "tb", "m1", r, tasks);
  EXPECT_TRUE(starts_with(path, dir / "tb/events.out.tfevents.")) << path;
  const TbScalars tb = read_tb_folder(dir / "tb", t0);
  EXPECT_EQ(tb.steps_in_order, std::vector<int64_t>(ctxs.begin(), ctxs.end()));
  const Expected want = expected_from_csvs(eval::needle_csv(r), eval::synthetic_csv(r), "m1");
  EXPECT_EQ(want.begin()->second.size(), static_cast<size_t>(depths + 1 + 1 + 2));
  expect_events(tb, want);
}

TEST(NeedleTensorBoard, ProgramWritesEventsBesideItsOutputs) {
  const std::string evaln = bin_dir() + "/easyctx_eval_needle";
  ASSERT_TRUE(fs::exists(evaln)) << evaln << " not built";
  TempDir dir("needle-tb-cli");
  std::string out;
  ASSERT_EQ(run_shell("bash " + source_dir() + "/scripts/make_demo_tokenizer.sh " + dir / "tok", out), 0) << out;
  const std::string tok = split(trim(out), '\n').back();  // the script prints the path last
  const uint64_t seed = test_seed() % 1000;
  const std::string cmd =
      evaln + " --model random:demo@" + std::to_string(seed) + " --tokenizer " + tok +
      " --device cpu --min-context-length 100 --max-context-length 200 --context-interval 100 "
      "--depth-interval 0.5 --samples 2 --digits 5 --task needle,passkey --progress-every 0 --seed " +
      std::to_string(seed);
  const double t0 = unix_now();
  ASSERT_EQ(run_shell(cmd + " --output-dir " + dir / "a", out), 0) << out;
  const std::string label = "demo";  // random:SPEC's label is its shape
  const TbScalars tb = read_tb_folder(dir / "a/tensorboard", t0);
  EXPECT_EQ(tb.files, 1u);
  EXPECT_EQ(tb.steps_in_order, (std::vector<int64_t>{100, 200}));
  const Expected want = expected_from_csvs(read_file(dir / "a/needle.csv"), read_file(dir / "a/synthetic.csv"), label);
  EXPECT_EQ(want.at(100).size(), 5u);  // needle, 3 depths, passkey
  expect_events(tb, want);
  ASSERT_EQ(run_shell(cmd + " --output-dir " + dir / "b --tensorboard " + dir / "elsewhere", out), 0) << out;
  EXPECT_FALSE(fs::exists(dir / "b/tensorboard"));
  EXPECT_EQ(read_tb_folder(dir / "elsewhere", t0).by_step.size(), 2u);
}

}  // namespace
}  // namespace easyctx::test
