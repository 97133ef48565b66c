// easyctx_eval_ppl's TensorBoard events end to end on the CPU: two random tiny models on a
// fresh walk shard; the event file (default folder: the CSV's folder's tensorboard/, or
// --tensorboard DIR; none: no file) holds per length one event at step = the length with
// eval_ppl/<label> of each model, equal to the CSV's perplexity (which has 10 digits: equal to
// within float32 rounding), every record's CRCs checked.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "core/strings.h"
#include "tensorboard_test_util.h"
#include "train_test_util.h"

namespace easyctx::test {
namespace {

namespace fs = std::filesystem;

TEST(EvalTensorBoard, PplEventsMatchTheCsv) {
  const std::string evalp = bin_dir() + "/easyctx_eval_ppl";
  ASSERT_TRUE(fs::exists(evalp)) << evalp << " not built";
  const uint64_t seed = test_seed();
  std::mt19937_64 rng(seed);
  TempDir dir("eval-tb");
  for (const char* d : {"data", "out", "b", "c"}) fs::create_directories(dir / d);
  write_walk_shard(dir / "data/shard-0.h5", seed, 12, 20, 70, 256);
  const int64_t min = 8 + static_cast<int64_t>(rng() % 8), step = 8 + static_cast<int64_t>(rng() % 8);
  const std::string models = " --model random:tiny@" + std::to_string(rng() % 1000) + " --model random:tiny@" +
                             std::to_string(1000 + rng() % 1000);
  const std::string cmd = evalp + models + " --device cpu --tokenized " + dir / "data" + " --min-tokens " +
                          std::to_string(min) + " --max-tokens " + std::to_string(min + 2 * step) + " --tokens-step " +
                          std::to_string(step) + " --samples 3 --plot none";
  const double t0 = unix_now();
  std::string out;
  ASSERT_EQ(run_shell(cmd + " --output-file " + dir / "out/ppl.csv", out), 0) << out;
  // The CSV: model,tokens,ppl,documents,nll.
  std::map<int64_t, std::map<std::string, double>> csv;
  const std::vector<std::string> lines = split(trim(read_file(dir / "out/ppl.csv")), '\n');
  ASSERT_EQ(lines.size(), 7u);
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> f = split(lines[i], ',');
    ASSERT_EQ(f.size(), 5u) << lines[i];
    csv[std::stoll(f[1])]["eval_ppl/" + f[0]] = std::stod(f[2]);
  }
  const TbScalars tb = read_tb_folder(dir / "out/tensorboard", t0);
  EXPECT_EQ(tb.files, 1u);
  EXPECT_EQ(tb.steps_in_order, (std::vector<int64_t>{min, min + step, min + 2 * step}));
  ASSERT_EQ(tb.by_step.size(), csv.size());
  for (const auto& [tokens, m] : csv) {
    ASSERT_EQ(tb.by_step.count(tokens), 1u) << tokens;
    const auto& t = tb.by_step.at(tokens);
    EXPECT_EQ(t.size(), 2u);
    for (const auto& [tag, ppl] : m) {
      ASSERT_EQ(t.count(tag), 1u) << tag << " at " << tokens;
      EXPECT_GT(ppl, 1.0);
      // float32 rounding (2^-24 relative) plus the CSV's 10 digits
      EXPECT_LE(std::abs(static_cast<double>(t.at(tag)) - ppl), ppl * 7e-8) << tag << " at " << tokens;
    }
  }
  // --tensorboard DIR; none.
  ASSERT_EQ(run_shell(cmd + " --output-file " + dir / "b/ppl.csv --tensorboard " + dir / "custom", out), 0) << out;
  EXPECT_EQ(read_tb_folder(dir / "custom", t0).by_step.size(), 3u);
  EXPECT_FALSE(fs::exists(dir / "b/tensorboard"));
  ASSERT_EQ(run_shell(cmd + " --output-file " + dir / "c/ppl.csv --tensorboard none", out), 0) << out;
  EXPECT_TRUE(fs::exists(dir / "c/ppl.csv"));
  EXPECT_FALSE(fs::exists(dir / "c/tensorboard"));
}

}  // namespace
}  // namespace easyctx::test
