// End to end: easyctx_train on a small generated dataset, then easyctx_eval_ppl on its
// Hugging Face export. Skips when the programs are not built.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "core/strings.h"
#include "train_test_util.h"

namespace easyctx::test {
namespace {

TEST(TrainE2E, TrainThenEvalPpl) {
  const std::string train = bin_dir() + "/easyctx_train", evalp = bin_dir() + "/easyctx_eval_ppl";
  if (!std::filesystem::exists(train) || !std::filesystem::exists(evalp)) GTEST_SKIP() << "programs not built";
  TempDir dir("e2e");
  std::filesystem::create_directories(dir / "data");
  write_walk_shard(dir / "data/shard-0.h5", test_seed(), 120, 20, 150, 256);
  std::ostringstream y;
  y << "model: {config: tiny}\n"
    << "data: {path: " << dir / "data"
    << ", seq_length: 48}\n"
    << "train: {device: cpu, steps: 25, batch_size: 4, lr: 1.0e-2, schedule: cosine, warmup_steps: 3}\n"
    << "parallel: {sequence: {size: 1}}\n"
    << "activation: {checkpoint: layer}\n"
    << "output: {dir: " << dir / "run"
    << "}\n"
    << "logging: {every: 5}\n";
  write_file_atomic(dir / "stage.yaml", y.str());
  std::string out;
  ASSERT_EQ(run_shell(train + " " + dir / "stage.yaml", out), 0) << out;
  EXPECT_NE(out.find("step 25/25"), std::string::npos) << out;
  EXPECT_NE(out.find("unigram entropy"), std::string::npos) << out;
  const std::string metrics = read_file(dir / "run/metrics.jsonl");
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 25);
  ASSERT_TRUE(std::filesystem::exists(dir / "run/final/model.safetensors"));
  ASSERT_EQ(
      run_shell(evalp + " --model " + dir / "run/final" + " --tokenized " + dir / "data" +
                    " --min-tokens 16 --max-tokens 64 --tokens-step 16 --samples 4 --output-file " + dir / "ppl.csv",
                out),
      0)
      << out;
  const std::vector<std::string> lines = split(trim(read_file(dir / "ppl.csv")), '\n');
  ASSERT_EQ(lines.size(), 5u) << read_file(dir / "ppl.csv");
  EXPECT_EQ(lines[0], "tokens,ppl,documents,nll");
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> f = split(lines[i], ',');
    ASSERT_EQ(f.size(), 4u);
    const double ppl = std::stod(f[1]);
    EXPECT_GT(ppl, 1.0);
    EXPECT_LT(ppl, 256.0) << "a trained model beats uniform on its training data: " << lines[i];
    EXPECT_EQ(f[2], "4");
  }
}

}  // namespace
}  // namespace easyctx::test
