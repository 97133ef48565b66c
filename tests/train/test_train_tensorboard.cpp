// easyctx_train's TensorBoard events (logging.tensorboard) end to end on the CPU: a run killed
// (SIGKILL) right after the metrics record of a step that no checkpoint covers leaves a
// readable event file with exactly metrics.jsonl's numbers; the resumed run adds a second
// file that starts with a SessionLog START at its first step, and the folder read as
// TensorBoard reads it holds, step by step and tag by tag, the float32 of every number of the
// final metrics.jsonl (the resumed steps' new timings, not the killed process's). Off, no folder.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <sstream>

#include "core/json.h"
#include "core/strings.h"
#include "tensorboard_test_util.h"
#include "train_test_util.h"

namespace easyctx::test {
namespace {

namespace fs = std::filesystem;

// metrics.jsonl as step -> ("train/" + key) -> float32 of the number (true: 1).
std::map<int64_t, std::map<std::string, float>> metrics_scalars(const std::string& path) {
  std::map<int64_t, std::map<std::string, float>> out;
  for (const std::string& line : split(trim(read_file(path)), '\n')) {
    const Json j = parse_json(line, path);
    const int64_t step = j.at("step").as_int();
    EXPECT_EQ(out.count(step), 0u) << path << ": step " << step << " twice";
    auto& m = out[step];
    for (const auto& [k, v] : j.as_object()) {
      if (k == "step") continue;
      if (v.is_bool()) m["train/" + k] = v.as_bool() ? 1.0f : 0.0f;
      else m["train/" + k] = static_cast<float>(v.as_double());
    }
  }
  return out;
}

void expect_same(const std::map<int64_t, std::map<std::string, float>>& tb,
                 const std::map<int64_t, std::map<std::string, float>>& metrics, const std::string& what) {
  ASSERT_EQ(tb.size(), metrics.size()) << what;
  for (const auto& [step, m] : metrics) {
    ASSERT_EQ(tb.count(step), 1u) << what << ": step " << step << " missing";
    const auto& t = tb.at(step);
    EXPECT_EQ(t.size(), m.size()) << what << ": step " << step;
    for (const auto& [tag, v] : m) {
      ASSERT_EQ(t.count(tag), 1u) << what << ": step " << step << " has no " << tag;
      EXPECT_EQ(t.at(tag), v) << what << ": step " << step << " " << tag;  // the same float32
    }
  }
}

TEST(TrainTensorBoard, KilledThenResumedRunMatchesMetricsExactly) {
  const std::string train = bin_dir() + "/easyctx_train";
  ASSERT_TRUE(fs::exists(train)) << train << " not built";
  const uint64_t seed = test_seed();
  std::mt19937_64 rng(seed);
  TempDir dir("train-tb");
  fs::create_directories(dir / "data");
  write_walk_shard(dir / "data/shard-0.h5", seed, 60, 20, 90, 256);
  const int steps = 7 + static_cast<int>(rng() % 3), kill_after = 5;  // checkpoint at 3; killed after 5
  std::ostringstream y;
  y << "model: {config: tiny}\n"
    << "data: {path: " << dir / "data"
    << ", seq_length: 32}\n"
    << "train: {device: cpu, steps: " << steps
    << ", batch_size: 2, lr: 3.0e-3, warmup_steps: 2, seed: " << (seed % 100000) << "}\n"
    << "activation: {checkpoint: layer}\n"
    << "output: {dir: " << dir / "run"
    << ", save_every: 3, export_hf: false}\n"
    << "logging: {every: 4}\n";
  write_file_atomic(dir / "stage.yaml", y.str());
  const double t0 = unix_now();
  std::string out;
  EXPECT_NE(
      run_shell("EASYCTX_FAULT=recorded@" + std::to_string(kill_after) + ":0 " + train + " " + dir / "stage.yaml", out),
      0)
      << out;
  const std::string tbdir = dir / "run/tensorboard";
  {  // What the killed process left: every step it logged, readable.
    const TbScalars killed = read_tb_folder(tbdir, t0);
    EXPECT_EQ(killed.files, 1u);
    EXPECT_EQ(killed.starts, 0);
    expect_same(killed.by_step, metrics_scalars(dir / "run/metrics.jsonl"), "killed run");
    EXPECT_EQ(killed.by_step.rbegin()->first, kill_after) << out;
  }
  ASSERT_EQ(run_shell(train + " " + dir / "stage.yaml", out), 0) << out;
  EXPECT_NE(out.find("TensorBoard events: " + tbdir + "/events.out.tfevents."), std::string::npos) << out;
  const TbScalars all = read_tb_folder(tbdir, t0);
  EXPECT_EQ(all.files, 2u);
  EXPECT_EQ(all.starts, 1) << "the resumed file starts with a SessionLog START";
  std::vector<int64_t> order;
  for (int64_t s = 1; s <= kill_after; ++s) order.push_back(s);
  for (int64_t s = 4; s <= steps; ++s) order.push_back(s);  // resumed from the checkpoint of step 3
  EXPECT_EQ(all.steps_in_order, order);
  const auto metrics = metrics_scalars(dir / "run/metrics.jsonl");
  ASSERT_EQ(metrics.size(), static_cast<size_t>(steps));
  for (const char* k : {"train/loss", "train/lr", "train/grad_norm", "train/tokens", "train/tokens_per_s",
                        "train/elapsed", "train/host_peak_gib"})
    EXPECT_EQ(metrics.at(1).count(k), 1u) << k;
  expect_same(all.by_step, metrics, "after the resume");
  // logging.tensorboard: false writes no folder.
  ASSERT_EQ(run_shell(train + " " + dir / "stage.yaml" + " --set output.dir=" + dir / "off" +
                          " --set train.steps=2 --set logging.tensorboard=false",
                      out),
            0)
      << out;
  EXPECT_TRUE(fs::exists(dir / "off/metrics.jsonl"));
  EXPECT_FALSE(fs::exists(dir / "off/tensorboard"));
}

// A run killed before its first checkpoint starts over at step 0 with --resume auto: its new
// event file starts with a SessionLog START at step 1, so the killed process's events of the
// same steps are dropped (TensorBoard would otherwise show both); and a folder holding another
// run's events (no run.json, no metrics: a run with logging.metrics false) has them moved to
// previous/ when a new run starts there, as another run's metrics.jsonl is.
TEST(TrainTensorBoard, StartOverAndAnotherRunsEvents) {
  const std::string train = bin_dir() + "/easyctx_train";
  ASSERT_TRUE(fs::exists(train)) << train << " not built";
  const uint64_t seed = test_seed();
  TempDir dir("train-tb-over");
  write_walk_shard(dir / "shard.h5", seed, 40, 20, 90, 256);
  const int steps = 6;
  write_file_atomic(dir / "stage.yaml", "model: {config: tiny}\ndata: {path: " + dir / "shard.h5" +
                                            ", seq_length: 32}\ntrain: {device: cpu, steps: " + std::to_string(steps) +
                                            ", batch_size: 2, seed: " + std::to_string(seed % 1000) +
                                            "}\nactivation: {checkpoint: layer}\n"
                                            "output: {dir: " +
                                            dir / "run" + ", save_every: 5, export_hf: false}\n");
  const double t0 = unix_now();
  std::string out;
  const int kill_after = 1 + static_cast<int>(seed % 3);  // before the checkpoint of step 5
  EXPECT_NE(
      run_shell("EASYCTX_FAULT=recorded@" + std::to_string(kill_after) + ":0 " + train + " " + dir / "stage.yaml", out),
      0)
      << out;
  ASSERT_EQ(run_shell(train + " " + dir / "stage.yaml", out), 0) << out;
  const TbScalars all = read_tb_folder(dir / "run/tensorboard", t0);  // (fails on a step seen twice)
  EXPECT_EQ(all.files, 2u);
  EXPECT_EQ(all.starts, 1) << "the file of the run that started over begins with a SessionLog START";
  expect_same(all.by_step, metrics_scalars(dir / "run/metrics.jsonl"), "after starting over");
  // Another run's events only: a new run moves them to previous/, its own file is alone.
  fs::create_directories(dir / "other");
  fs::rename(dir / "run/tensorboard", dir / "other/tensorboard");
  ASSERT_EQ(run_shell(train + " " + dir / "stage.yaml" + " --set output.dir=" + dir / "other", out), 0) << out;
  EXPECT_EQ(tb::list_event_files(dir / "other/tensorboard").size(), 1u) << out;
  bool archived = false;
  for (const auto& e : fs::directory_iterator(dir / "other/previous"))
    archived = archived || tb::list_event_files((e.path() / "tensorboard").string()).size() == 2;
  EXPECT_TRUE(archived) << "the other run's event files are not under previous/<id>/tensorboard\n" << out;
}

}  // namespace
}  // namespace easyctx::test
