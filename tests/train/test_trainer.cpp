// Trainer behaviour on the tiny preset with a learnable synthetic shard: the loss falls,
// gradient accumulation equals a bigger micro-batch, activation checkpointing changes
// nothing, LR schedules have the documented shape.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "core/json.h"
#include "core/strings.h"
#include "dist/groups.h"
#include "plan/memory_plan.h"
#include "report/run_report.h"
#include "ops/half.h"
#include "zero/adamw_span.h"
#include "train/schedule.h"
#include "train/trainer.h"
#include "train_test_util.h"

namespace easyctx::test {
namespace {

std::vector<float> weights(const train::Trainer& t) {
  std::vector<float> w;
  for (const ops::Tensor& u : t.master()) w.insert(w.end(), u.ptr<float>(), u.ptr<float>() + u.numel());
  return w;
}

TEST(Trainer, LossFallsWellBelowUniform) {
  TempDir dir("train-falls");
  write_walk_shard(dir / "shard.h5", test_seed(), 200, 20, 120, 256);
  StageConfig c = tiny_stage(dir / "shard.h5", dir / "out");
  c.train.steps = 60;
  c.train.batch_size = 4;
  c.train.lr = 1e-2;
  c.train.schedule = LrSchedule::Cosine;
  c.train.warmup_steps = 5;
  c.train.min_lr = 1e-3;
  auto world = self_comm("world"), dp = self_comm("dp");
  train::Trainer t(c, *world, *dp);
  const double first = t.train_step(0).loss;
  EXPECT_NEAR(first, std::log(256.0), 0.5);  // random init: about uniform
  double last = first;
  for (int64_t s = 1; s < c.train.steps; ++s) last = t.train_step(s).loss;
  EXPECT_LT(last, 3.0) << "first " << first;  // uniform is 5.55 nats, the walk ~1.1 + BOS/doc starts
}

TEST(Trainer, GradAccumulationEqualsLargerBatch) {
  TempDir dir("train-accum");
  write_walk_shard(dir / "shard.h5", test_seed(), 60, 10, 80, 256);
  auto world = self_comm("world"), dp = self_comm("dp");
  StageConfig a = tiny_stage(dir / "shard.h5", dir / "a");
  a.train.batch_size = 2;
  a.train.grad_accum = 1;
  StageConfig b = a;
  b.train.batch_size = 1;
  b.train.grad_accum = 2;
  train::Trainer ta(a, *world, *dp), tb(b, *world, *dp);
  for (int64_t s = 0; s < 3; ++s) {
    const train::StepStats sa = ta.train_step(s), sb = tb.train_step(s);
    EXPECT_EQ(sa.labels, sb.labels);
    EXPECT_NEAR(sa.loss, sb.loss, 1e-5 * sa.loss) << "step " << s;
    EXPECT_NEAR(sa.grad_norm, sb.grad_norm, 1e-4 * sa.grad_norm) << "step " << s;
  }
  // Adam turns a gradient element near 0 whose sign the summation order flips into a full
  // +-lr step either way, so the weights differ by more than the gradients (over 161 seeds:
  // up to 2.9e-5, 2 of them above the 1e-5 this test had). A wrong accumulation (a missing
  // micro-batch, a wrong divisor) already fails the per-step loss and gradient norm above.
  EXPECT_LT(rel_error(weights(ta), weights(tb)), 1e-4);
}

TEST(Trainer, CheckpointPolicyDoesNotChangeTheResult) {
  TempDir dir("train-ckpt");
  write_walk_shard(dir / "shard.h5", test_seed(), 40, 10, 80, 256);
  auto world = self_comm("world"), dp = self_comm("dp");
  StageConfig a = tiny_stage(dir / "shard.h5", dir / "a");
  StageConfig b = a, c = a;
  a.activation.checkpoint = CheckpointPolicy::None;
  c.activation.checkpoint = CheckpointPolicy::AttentionOutput;
  train::Trainer ta(a, *world, *dp), tb(b, *world, *dp), tc(c, *world, *dp);
  for (int64_t s = 0; s < 2; ++s) {
    const double la = ta.train_step(s).loss;
    EXPECT_EQ(la, tb.train_step(s).loss);
    EXPECT_EQ(la, tc.train_step(s).loss);
  }
  EXPECT_EQ(weights(ta), weights(tb));  // recomputation is bit-identical
  EXPECT_EQ(weights(ta), weights(tc));
}

// logging.profile: the ops run behind the profiler give the same bits; the run writes
// profile.json with the step's phases and per-op rows (the forward's and the recompute's
// attention, the backward's, the matmuls with their FLOPs).
TEST(Trainer, ProfileChangesNothingAndWritesTheReport) {
  TempDir dir("train-profile");
  write_walk_shard(dir / "shard.h5", test_seed(), 40, 10, 80, 256);
  auto world = self_comm("world"), dp = self_comm("dp");
  StageConfig a = tiny_stage(dir / "shard.h5", dir / "a");
  a.train.steps = 3;
  a.output.save_final = false;
  StageConfig b = a;
  b.logging.profile = true;
  b.output.dir = dir / "b";
  train::Trainer ta(a, *world, *dp), tb(b, *world, *dp);
  const train::StepStats sa = ta.run(), sb = tb.run();
  EXPECT_EQ(sa.loss, sb.loss);
  EXPECT_EQ(weights(ta), weights(tb));
  EXPECT_FALSE(std::filesystem::exists(dir / "a" + "/profile.json"));
  const Json j = parse_json(read_file(dir / "b" + "/profile.json"));
  EXPECT_EQ(j.at("steps").as_int(), 2);  // every step but the first
  for (const char* ph : {"data", "forward+backward", "gradient reduction", "clip", "optimizer"})
    EXPECT_GE(j.at("phases_ms").at(ph).as_double(), 0) << ph;
  const int64_t layers = ta.model().config().num_layers;
  std::map<std::string, double> calls;
  for (const Json& r : j.at("ops").as_array()) {
    const std::string op = r.at("op").as_string();
    calls[op.substr(0, op.find(' '))] += r.at("calls").as_double();
    if (op.rfind("matmul", 0) == 0) { EXPECT_GT(r.at("tflops").as_double(), 0) << op; }
  }
  EXPECT_EQ(calls["attention_fwd"], 2.0 * static_cast<double>(layers));  // forward + recompute (checkpoint layer)
  EXPECT_EQ(calls["attention_bwd"], static_cast<double>(layers));
  EXPECT_GT(calls["matmul"], 0);
  EXPECT_EQ(calls["lm_head_loss"], 1.0);
}

// activation.offload: cpu runs its code path on the CPU backend too (the checkpoints copied to
// separate host buffers and back, one layer ahead): the same losses and weights as keeping
// them, bit for bit, on 5 layers (4 layer inputs and 3 attention outputs travel, or with
// activation.offload_layers only the first 2 or 3 inputs), with MLP tiles and accumulation;
// refused with checkpoint none, naming both keys.
TEST(Trainer, ActivationOffloadIsBitIdentical) {
  TempDir dir("train-act-offload");
  write_walk_shard(dir / "shard.h5", test_seed(), 40, 10, 80, 256);
  auto world = self_comm("world"), dp = self_comm("dp");
  StageConfig base = tiny_stage(dir / "shard.h5", dir / "a");
  base.model.config = write_tiny_model(dir.path(), 5);
  struct Variant {
    CheckpointPolicy policy;
    int64_t mlp_tile, grad_accum, offload_layers;
  };
  for (const Variant v :
       {Variant{CheckpointPolicy::Layer, 0, 1, 0}, Variant{CheckpointPolicy::AttentionOutput, 0, 2, 0},
        Variant{CheckpointPolicy::Layer, 7, 1, 0}, Variant{CheckpointPolicy::AttentionOutput, 7, 1, 0},
        Variant{CheckpointPolicy::Layer, 0, 2, 2}, Variant{CheckpointPolicy::AttentionOutput, 7, 1, 3}}) {
    SCOPED_TRACE(std::string(to_string(v.policy)) + " mlp_tile " + std::to_string(v.mlp_tile) + " offload_layers " +
                 std::to_string(v.offload_layers));
    StageConfig a = base;
    a.activation.checkpoint = v.policy;
    a.activation.mlp_tile = v.mlp_tile;
    a.train.grad_accum = v.grad_accum;
    StageConfig b = a;
    b.activation.offload = OffloadTarget::Cpu;
    b.activation.offload_layers = v.offload_layers;
    b.output.dir = dir / "b";
    train::Trainer ta(a, *world, *dp), tb(b, *world, *dp);
    for (int64_t s = 0; s < 3; ++s) {
      const train::StepStats sa = ta.train_step(s), sb = tb.train_step(s);
      EXPECT_EQ(sa.loss, sb.loss) << "step " << s;
      EXPECT_EQ(sa.grad_norm, sb.grad_norm) << "step " << s;
    }
    EXPECT_EQ(weights(ta), weights(tb));
  }
  StageConfig none = base;
  none.activation.checkpoint = CheckpointPolicy::None;
  none.activation.offload = OffloadTarget::Cpu;
  try {
    train::Trainer t(none, *world, *dp);
    FAIL() << "activation.offload cpu with checkpoint none was accepted";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("activation.offload: cpu needs activation.checkpoint layer or attention_output"),
              std::string::npos)
        << m;
  }
}

// activation.mlp_tile: the MLP a tile of rows at a time (forward, and recomputed per tile in
// backward) changes only the summation order of the weight gradients.
TEST(Trainer, MlpTilingMatchesUntiled) {
  TempDir dir("train-mlp-tile");
  write_walk_shard(dir / "shard.h5", test_seed(), 40, 10, 80, 256);
  auto world = self_comm("world"), dp = self_comm("dp");
  StageConfig a = tiny_stage(dir / "shard.h5", dir / "a");
  StageConfig b = a, c = a;
  b.activation.mlp_tile = 7;  // does not divide the tokens: a short last tile
  c.activation.checkpoint = CheckpointPolicy::AttentionOutput;
  c.activation.mlp_tile = 5;
  ASSERT_GT(a.data.seq_length * a.train.batch_size, 7);
  train::Trainer ta(a, *world, *dp), tb(b, *world, *dp), tc(c, *world, *dp);
  for (int64_t s = 0; s < 3; ++s) {
    const double la = ta.train_step(s).loss;
    EXPECT_NEAR(tb.train_step(s).loss, la, 1e-6 * la) << "step " << s;
    EXPECT_NEAR(tc.train_step(s).loss, la, 1e-6 * la) << "step " << s;
  }
  // (Adam's normalisation lifts fp32 summation-order differences of ~1e-7 to ~1e-6, and to
  // 1.2e-5 for an occasional seed whose walk leaves a gradient that nearly cancels; a real
  // error, a tile's rows dropped or counted twice, is orders of magnitude larger)
  EXPECT_LT(rel_error(weights(ta), weights(tb)), 5e-5);
  EXPECT_LT(rel_error(weights(ta), weights(tc)), 5e-5);
  StageConfig d = a;
  d.activation.checkpoint = CheckpointPolicy::None;
  d.activation.mlp_tile = 4;
  try {
    train::Trainer td(d, *world, *dp);
    FAIL() << "mlp_tile with checkpoint none was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("activation.mlp_tile"), std::string::npos) << e.what();
  }
}

TEST(Trainer, RerunIsBitIdenticalAndFinalSaveLoads) {
  TempDir dir("train-rerun");
  write_walk_shard(dir / "shard.h5", test_seed(), 40, 10, 80, 256);
  auto world = self_comm("world"), dp = self_comm("dp");
  StageConfig a = tiny_stage(dir / "shard.h5", dir / "a");
  a.logging.metrics = true;
  train::Trainer t1(a, *world, *dp);
  t1.run();
  StageConfig b = a;
  b.output.dir = dir / "b";
  b.model.init = "hf:" + (dir / "a") + "/final";
  b.model.config = ModelConfig{}.config;
  b.train.steps = 0;
  train::Trainer t2(b, *world, *dp);  // loads what t1 saved
  EXPECT_EQ(weights(t1), weights(t2));
  StageConfig c = a;
  c.output.dir = dir / "c";
  train::Trainer t3(c, *world, *dp);
  t3.run();
  EXPECT_EQ(weights(t1), weights(t3));
  const std::string metrics = read_file(dir / "a/metrics.jsonl");
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), a.train.steps);
  for (const char* k :
       {"\"step\"", "\"loss\"", "\"lr\"", "\"grad_norm\"", "\"tokens\"", "\"tokens_per_s\"", "\"elapsed\""})
    EXPECT_NE(metrics.find(k), std::string::npos) << k;
}

// Trainer::run writes <output.dir>/plan.json: plan::plan_to_json of the plan it was checked
// against (the same run, settings, items and allocations as the plan made for that launch);
// easyctx_report reads it and shows its totals and knobs; a new run in the folder moves the
// earlier run's plan.json to previous/<its id>/ with its other files.
TEST(Trainer, RunWritesItsMemoryPlanForTheReport) {
  TempDir dir("train-plan-json");
  write_walk_shard(dir / "shard.h5", test_seed(), 40, 10, 80, 256);
  auto world = self_comm("world"), dp = self_comm("dp");
  StageConfig a = tiny_stage(dir / "shard.h5", dir / "a");
  a.logging.metrics = true;
  a.activation.mlp_tile = 16;
  std::string first_run;
  {
    train::Trainer t(a, *world, *dp);
    t.run();
    first_run = t.run_id();
  }
  const Json got = parse_json(read_file(dir / "a/plan.json"), "plan.json");
  const Json want = plan::plan_to_json(plan::plan_for_run(a, 1, 1));
  for (const char* k :
       {"fits", "run", "settings", "allocations_peak_bytes", "allocations_peak_phase", "attention_routes"})
    EXPECT_EQ(got.at(k).dump(), want.at(k).dump()) << k;
  ASSERT_EQ(got.at("items").size(), want.at("items").size());
  for (size_t i = 0; i < got.at("items").size(); ++i)
    EXPECT_EQ(got.at("items")[i].at("name").dump(), want.at("items")[i].at("name").dump()) << i;
  EXPECT_EQ(got.at("settings").at("activation.mlp_tile").as_int(), 16);
  EXPECT_GT(got.at("host").at("per_node_peak_bytes").as_int(), 0);
  const report::StageRun st = report::read_stage(dir / "a");
  EXPECT_EQ(st.plan.dump(), got.dump());
  const Json data = report::report_data({st});
  EXPECT_EQ(data.at("stages")[0].at("plan").at("host_per_node_peak_bytes").as_int(),
            got.at("host").at("per_node_peak_bytes").as_int());
  EXPECT_EQ(data.at("stages")[0].at("plan").at("settings").dump(), got.at("settings").dump());
  const std::string page = report::render_report({st}, "plan");
  EXPECT_NE(page.find("activation.mlp_tile 16"), std::string::npos);
  EXPECT_NE(page.find("plan host per node (GiB)"), std::string::npos);
  // A new run in the same folder: the first run's plan goes with its metrics.
  train::RunOptions fresh;
  fresh.resume = "none";
  {
    train::Trainer t(a, *world, *dp, fresh);
    t.run();
  }
  EXPECT_EQ(read_file(dir / ("a/previous/" + first_run + "/plan.json")), got.dump(1) + "\n");
  EXPECT_TRUE(std::filesystem::exists(dir / "a/plan.json"));
}

TEST(Trainer, ThreadCountDoesNotChangeTheResult) {
  TempDir dir("train-threads");
  write_walk_shard(dir / "shard.h5", test_seed(), 40, 10, 200, 256);
  auto world = self_comm("world"), dp = self_comm("dp");
  StageConfig c = tiny_stage(dir / "shard.h5", dir / "a");
  c.data.seq_length = 160;  // big enough that the kernels take their parallel paths
  c.train.batch_size = 4;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  train::Trainer t1(c, *world, *dp);
  for (int64_t s = 0; s < 2; ++s) t1.train_step(s);
  omp_set_num_threads(3);
  train::Trainer t3(c, *world, *dp);
  for (int64_t s = 0; s < 2; ++s) t3.train_step(s);
  omp_set_num_threads(saved);
  EXPECT_EQ(weights(t1), weights(t3));
}

TEST(Trainer, ResumeFromCheckpointIsBitIdentical) {
  TempDir dir("train-resume");
  write_walk_shard(dir / "shard.h5", test_seed(), 40, 10, 80, 256);
  auto world = self_comm("world"), dp = self_comm("dp");
  StageConfig c = tiny_stage(dir / "shard.h5", dir / "run");
  c.train.steps = 6;
  c.train.schedule = LrSchedule::Cosine;
  c.train.warmup_steps = 2;
  {  // "killed" after 3 steps, right after a checkpoint
    train::Trainer t(c, *world, *dp);
    EXPECT_EQ(t.start_step(), 0);
    for (int64_t s = 0; s < 3; ++s) t.train_step(s);
    t.save_checkpoint(3);
  }
  train::Trainer resumed(c, *world, *dp);  // same output.dir: resumes
  EXPECT_EQ(resumed.start_step(), 3);
  std::vector<double> losses;
  for (int64_t s = 3; s < 6; ++s) losses.push_back(resumed.train_step(s).loss);
  StageConfig f = c;
  f.output.dir = dir / "fresh";
  train::Trainer fresh(f, *world, *dp);
  for (int64_t s = 0; s < 6; ++s) {
    const double l = fresh.train_step(s).loss;
    if (s >= 3) { EXPECT_EQ(l, losses[static_cast<size_t>(s - 3)]) << "step " << s; }
  }
  EXPECT_EQ(weights(resumed), weights(fresh));
  // Another stage starting from this run's checkpoint: its weights, a fresh optimizer.
  StageConfig next = c;
  next.output.dir = dir / "next";
  next.model.init = "ckpt:" + (dir / "run");
  train::Trainer staged(next, *world, *dp);
  EXPECT_EQ(staged.start_step(), 0);
  const std::vector<float> w3 = weights(staged);
  train::Trainer again(c, *world, *dp);  // resumes at 3 again: the same weights
  EXPECT_EQ(w3, weights(again));
}

// A stage from a checkpoint trained at another RoPE theta, without model.rope_theta of its
// own, says so on stderr, naming the key and both thetas; naming the theta silences it.
TEST(Trainer, StageFromCheckpointWarnsWhenThetaIsNotSet) {
  TempDir dir("train-theta");
  write_walk_shard(dir / "shard.h5", test_seed(), 40, 10, 80, 256);
  auto world = self_comm("world"), dp = self_comm("dp");
  StageConfig c = tiny_stage(dir / "shard.h5", dir / "run");
  c.model.rope_theta = 50000;
  {
    train::Trainer t(c, *world, *dp);
    t.train_step(0);
    t.save_checkpoint(1);
  }
  StageConfig next = c;
  next.output.dir = dir / "next";
  next.model.init = "ckpt:" + (dir / "run");
  next.model.rope_theta = 0;  // model.config's (the tiny preset: 10000)
  ::testing::internal::CaptureStderr();
  { train::Trainer t(next, *world, *dp); }
  const std::string warned = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warned.find("trained at rope_theta 50000"), std::string::npos) << warned;
  EXPECT_NE(warned.find("model.rope_theta is not set"), std::string::npos) << warned;
  next.model.rope_theta = 200000;
  next.output.dir = dir / "set";
  ::testing::internal::CaptureStderr();
  { train::Trainer t(next, *world, *dp); }
  const std::string quiet = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(quiet.find("rope_theta"), std::string::npos) << quiet;
}

TEST(Clip, GlobalNormAcrossTensors) {
  auto be = ops::make_cpu_backend();
  std::mt19937_64 rng(test_seed());
  std::vector<ops::Buffer> bufs;
  std::vector<ops::Tensor> g;
  double ss = 0;
  for (int64_t n : {7, 130, 1}) {
    bufs.push_back(be->alloc(ops::DType::F32, n));
    for (int64_t i = 0; i < n; ++i) {
      const float x = static_cast<float>(std::uniform_real_distribution<double>(-1, 1)(rng));
      bufs.back().flat().ptr<float>()[i] = x;
      ss += static_cast<double>(x) * x;
    }
    g.push_back(bufs.back().flat());
  }
  const std::vector<float> before(g[1].ptr<float>(), g[1].ptr<float>() + 130);
  EXPECT_NEAR(train::clip_by_global_norm(*be, g, 1e9), std::sqrt(ss), 1e-9 * std::sqrt(ss));  // no clip
  EXPECT_EQ(std::vector<float>(g[1].ptr<float>(), g[1].ptr<float>() + 130), before);
  EXPECT_NEAR(train::clip_by_global_norm(*be, g, 0.5), std::sqrt(ss), 1e-6);
  double after = 0;
  for (const auto& t : g)
    for (int64_t i = 0; i < t.numel(); ++i) after += static_cast<double>(t.ptr<float>()[i]) * t.ptr<float>()[i];
  EXPECT_NEAR(std::sqrt(after), 0.5, 1e-5);
  EXPECT_NEAR(g[1].ptr<float>()[3] / before[3], 0.5 / std::sqrt(ss), 1e-5);  // one common factor
}

// The host AdamW's vectorised loop (parallel.zero.offload_optimizer) against the scalar element
// update it must equal bit for bit (the GPU kernel runs the same element code): random values
// over many magnitudes, zeros, denormals, infinities and NaNs in every input, odd lengths and
// unaligned starts so the vector loop's head and tail run too; and the bf16 conversion.
TEST(HostAdamWSpan, EqualsTheScalarUpdateBitForBit) {
  std::mt19937_64 rng(test_seed());
  std::uniform_real_distribution<double> u(-1, 1), e(-40, 10);
  std::uniform_int_distribution<int> pick(0, 99);
  auto value = [&](bool positive) {
    const int k = pick(rng);
    float x = static_cast<float>(u(rng) * std::exp2(e(rng)));
    if (k == 0) x = 0.f;
    if (k == 1) x = 1e-41f;  // denormal
    if (k == 2) x = std::numeric_limits<float>::infinity();
    if (k == 3) x = std::numeric_limits<float>::quiet_NaN();
    if (k == 4) x = 3.3895314e38f;  // rounds up to bf16 infinity
    return positive ? std::fabs(x) : x;
  };
  const kernels::AdamWConsts k = kernels::adamw_consts(3e-4, 0.9, 0.95, 1e-8, 0.1, 7);
  for (int64_t n : {1, 7, 31, 1000, 4099}) {
    for (int64_t off : {0, 1, 3}) {
      std::vector<float> p(n + off), g(n + off), m(n + off), v(n + off);
      for (int64_t i = 0; i < n + off; ++i)
        p[i] = value(false), g[i] = value(false), m[i] = value(false), v[i] = value(true);
      std::vector<float> p2 = p, m2 = m, v2 = v;
      std::vector<uint16_t> out(n + off, 0xdead), ref(n + off, 0xdead);
      zero::adamw_bf16_span(p.data() + off, g.data() + off, m.data() + off, v.data() + off, out.data() + off, n, k);
      for (int64_t i = off; i < n + off; ++i) {
        kernels::adamw_element(p2[i], g[i], m2[i], v2[i], k);
        ref[i] = ops::float_to_bf16(p2[i]);
      }
      auto bits = [](const std::vector<float>& x) {
        std::vector<uint32_t> b(x.size());
        std::memcpy(b.data(), x.data(), 4 * x.size());
        return b;
      };
      EXPECT_EQ(bits(p), bits(p2)) << "n " << n << " offset " << off;
      EXPECT_EQ(bits(m), bits(m2)) << "n " << n << " offset " << off;
      EXPECT_EQ(bits(v), bits(v2)) << "n " << n << " offset " << off;
      EXPECT_EQ(out, ref) << "n " << n << " offset " << off;
      std::vector<uint16_t> conv(n + off, 0xdead);
      zero::f32_to_bf16_span(g.data() + off, conv.data() + off, n);
      for (int64_t i = off; i < n + off; ++i) ASSERT_EQ(conv[i], ops::float_to_bf16(g[i])) << "element " << i;
    }
  }
}

TEST(Schedule, WarmupThenDecayToMinLr) {
  TrainConfig c;
  c.steps = 110;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.warmup_steps = 10;
  c.schedule = LrSchedule::Cosine;
  EXPECT_DOUBLE_EQ(train::lr_at(c, 0), 0.1);
  EXPECT_DOUBLE_EQ(train::lr_at(c, 9), 1.0);
  EXPECT_DOUBLE_EQ(train::lr_at(c, 10), 1.0);
  EXPECT_NEAR(train::lr_at(c, 109), 0.1, 1e-12);
  EXPECT_GT(train::lr_at(c, 50), 0.1);
  c.schedule = LrSchedule::Linear;
  EXPECT_NEAR(train::lr_at(c, 109), 0.1, 1e-12);
  EXPECT_NEAR(train::lr_at(c, 10 + 99 / 2.0), 0.55, 0.01);
  c.schedule = LrSchedule::Constant;
  EXPECT_DOUBLE_EQ(train::lr_at(c, 100), 1.0);
}

// data.document_mask trains: packed documents with restarted positions and attention inside
// each document give another loss than the same windows without the mask (that the masked
// loss and gradients equal each document run alone is tests/model/test_model_documents.cpp's).
TEST(Trainer, DocumentMaskChangesWhatTheModelSees) {
  TempDir dir("train-doc-mask");
  write_walk_shard(dir / "shard.h5", test_seed(), 60, 2, 12, 256);
  auto world = self_comm("world"), dp = self_comm("dp");
  StageConfig c = tiny_stage(dir / "shard.h5", dir / "masked");
  c.data.packing = DataPacking::BestFit;
  c.data.document_mask = true;
  train::Trainer masked(c, *world, *dp);
  const double a = masked.train_step(0).loss;
  c.data.document_mask = false;
  c.output.dir = dir / "plain";
  train::Trainer plain(c, *world, *dp);
  const double b = plain.train_step(0).loss;
  EXPECT_TRUE(std::isfinite(a));
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace easyctx::test
