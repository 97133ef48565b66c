// LoRA through the trainer under mpirun (2, 3 and 4 ranks; the cases that need a layout the
// world does not fit skip):
//  - every sequence-parallel mode (and data x sequence) against one rank on whole sequences:
//    the loss and every trainable gradient of the second step (after one update, so that B is
//    no longer zero and A has a gradient) to 1e-5, three more steps' losses;
//  - ZeRO-3 equals stage 0 (losses and trainable weights, bit for bit), also with the frozen
//    base's layers through the gather pool at every prefetch depth;
//  - the frozen base is bit-unchanged after steps, and holds no gradient or optimizer state;
//  - a step whose batch holds no labelled token makes no update (one rank);
//  - a stopped and resumed run equals 6 straight steps bit for bit; its checkpoint holds the
//    trainable tensors only and names its base; it reshards to fewer ranks; another base or
//    another lora section is refused; a LoRA checkpoint chains into the next stage
//    (model.init ckpt:), a full fine-tune's becomes the frozen base;
//  - the export: the PEFT adapter folder, merged into the base (easyctx_convert
//    --merge-lora), gives the logits of base + adapter in easyctx; model.adapter starts a LoRA
//    run from the folder, and a full fine-tune from the merged weights.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "ckpt/convert.h"
#include "ckpt/hf_model.h"
#include "ckpt/lora_adapter.h"
#include "ckpt/sharded_checkpoint.h"
#include "core/strings.h"
#include "data/sampler.h"
#include "data/shard.h"
#include "dist/comm_mpi.h"
#include "dist/groups.h"
#include "eval/model_source.h"
#include "train/trainer.h"
#include "train_test_util.h"

namespace easyctx::test {
namespace {

StageConfig lora_stage(const std::string& data, const std::string& out, uint64_t seed) {
  StageConfig c = tiny_stage(data, out);
  c.data.seq_length = 37;
  c.train.seed = seed;
  c.train.lr = 1e-2;
  c.lora.rank = 4;
  c.lora.alpha = 8;
  c.lora.targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
  c.lora.trainable = "embed_tokens,norm,lm_head";
  return c;
}

// Every trainable unit's gradient (stage 0 views; a frozen unit's entry is empty).
std::vector<std::vector<float>> trainable_grads(const train::Trainer& t) {
  std::vector<std::vector<float>> out;
  for (const ops::Tensor& g : t.gradients())
    out.emplace_back(g.empty() ? nullptr : g.ptr<float>(), g.empty() ? nullptr : g.ptr<float>() + g.numel());
  return out;
}

std::vector<float> trainable_weights(const train::Trainer& t) {
  std::vector<float> all;
  for (const auto& u : t.master_host()) all.insert(all.end(), u.begin(), u.end());
  return all;
}

struct SpCase {
  SeqParallelMode mode;
  int sp;  // 0: the world
  int ulysses = 0;
  CheckpointPolicy policy = CheckpointPolicy::Layer;
  int64_t groups = 1;
  bool documents = false;  // short documents packed best-fit, data.document_mask
};

void check_sp(const SpCase& c) {
  int argc = 0;
  char** argv = nullptr;
  dist::Runtime rt(&argc, &argv);
  const int W = rt.size(), sp = c.sp ? c.sp : W;
  if (W % sp != 0) GTEST_SKIP() << "sp " << sp << " does not divide " << W;
  if (c.mode == SeqParallelMode::Usp && W % 2 != 0) GTEST_SKIP() << "usp with ulysses 2 needs an even world";
  uint64_t seed = 0;
  const std::string path =
      shared_walk_dir("lora-sp" + std::to_string(W), seed, c.documents ? WalkShape{160, 2, 16, 256} : WalkShape{});
  StageConfig par = lora_stage(path + "/shard.h5", path + "/par", seed);
  if (c.documents) {
    par.data.document_mask = true;
    par.data.packing = DataPacking::BestFit;
  }
  par.parallel.sequence.mode = c.mode;
  par.parallel.sequence.size = sp;
  par.parallel.sequence.ulysses_size = c.ulysses;
  par.activation.checkpoint = c.policy;
  par.activation.attention_head_groups = c.groups;
  StageConfig one = par;
  one.parallel.sequence.size = 1;
  one.parallel.sequence.ulysses_size = 0;
  one.parallel.sequence.mode = SeqParallelMode::ZigzagRing;
  one.activation.attention_head_groups = 1;
  one.train.grad_accum = W / sp;
  one.output.dir = path + "/one";
  dist::GroupLayout layout;
  try {
    layout = dist::make_group_layout(par, W, rt.topology().local_size);
  } catch (const InputError& e) { GTEST_SKIP() << e.what(); }
  dist::ProcessGroups groups(rt, layout, dist::CommBackend::Mpi, 120);
  auto self = dist::make_comm(MPI_COMM_SELF, "self", dist::CommBackend::Mpi, 120);
  train::Trainer tpar(par, groups), tone(one, *self, *self);
  // Step 0's gradients (B's, the trainable copies'; A's are 0 while B is), then step 1's,
  // after an update, when A has one too. After an AdamW step a gradient that nearly cancels
  // moves its element by up to lr whatever its rounding: step 1's tolerance is 10x wider.
  for (int64_t step = 0; step < 2; ++step) {
    if (step == 1) {
      const double l0 = tpar.train_step(0).loss, l1 = tone.train_step(0).loss;
      EXPECT_NEAR(l0, l1, 1e-5 * l1);
    }
    const train::StepStats a = tpar.compute_gradients(step), b = tone.compute_gradients(step);
    EXPECT_NEAR(a.loss, b.loss, 1e-5 * b.loss);
    const auto ga = trainable_grads(tpar), gb = trainable_grads(tone);
    ASSERT_EQ(ga.size(), gb.size());
    for (size_t u = 0; u < ga.size(); ++u) {
      if (tpar.model().layout().units()[u].frozen) {
        EXPECT_TRUE(ga[u].empty() && gb[u].empty()) << "a frozen unit has a gradient";
        continue;
      }
      EXPECT_LT(rel_error(ga[u], gb[u]), step == 0 ? 1e-5 : 1e-4)
          << to_string(c.mode) << " W=" << W << " step " << step << " gradient of "
          << tpar.model().layout().units()[u].name;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rt.rank() == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(path);
}

TEST(LoraSequenceParallel, ZigzagRing) { check_sp({SeqParallelMode::ZigzagRing, 0}); }
TEST(LoraSequenceParallel, ZigzagRingAttentionOutputHeadGroups) {
  check_sp({SeqParallelMode::ZigzagRing, 0, 0, CheckpointPolicy::AttentionOutput, 2});
}
TEST(LoraSequenceParallel, Ulysses) { check_sp({SeqParallelMode::Ulysses, 2}); }
TEST(LoraSequenceParallel, DistFlash) { check_sp({SeqParallelMode::DistFlash, 0, 0, CheckpointPolicy::None}); }
TEST(LoraSequenceParallel, Usp) { check_sp({SeqParallelMode::Usp, 0, 2}); }
TEST(LoraSequenceParallel, DataTimesZigzag) { check_sp({SeqParallelMode::ZigzagRing, 2}); }
TEST(LoraSequenceParallel, DocumentsZigzagRing) {
  check_sp({SeqParallelMode::ZigzagRing, 0, 0, CheckpointPolicy::Layer, 1, true});
}

struct LoraRun {
  std::vector<double> losses;
  std::vector<float> w;
};

LoraRun run(dist::Runtime& rt, const StageConfig& c, int64_t from, int64_t to, int64_t save_at = -1) {
  dist::ProcessGroups groups(rt, dist::make_group_layout(c, rt.size(), rt.topology().local_size),
                             dist::CommBackend::Mpi, 120);
  train::Trainer t(c, groups);
  EXPECT_EQ(t.start_step(), from);
  LoraRun r;
  for (int64_t s = from; s < to; ++s) {
    r.losses.push_back(t.train_step(s).loss);
    if (s + 1 == save_at) t.save_checkpoint(save_at);
  }
  r.w = trainable_weights(t);
  return r;
}

// (prefetch, policy, lora.trainable: "" and "norm" leave the embedding and lm_head frozen, so
// ZeRO-3 gathers them once and never again)
class LoraZero3 : public ::testing::TestWithParam<std::tuple<int, CheckpointPolicy, const char*>> {};

TEST_P(LoraZero3, EqualsStage0BitForBit) {
  int argc = 0;
  char** argv = nullptr;
  dist::Runtime rt(&argc, &argv);
  const auto [prefetch, policy, trainable] = GetParam();
  uint64_t seed = 0;
  const std::string path = shared_walk_dir("lora-zero", seed);
  StageConfig c = lora_stage(path + "/shard.h5", path + "/s0", seed);
  c.activation.checkpoint = policy;
  c.lora.trainable = trainable;
  StageConfig z = c;
  z.parallel.zero.stage = 3;
  z.parallel.zero.prefetch = prefetch;
  z.output.dir = path + "/z3";
  const LoraRun a = run(rt, c, 0, 4), b = run(rt, z, 0, 4);
  EXPECT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.w.size(), b.w.size());
  EXPECT_EQ(std::memcmp(a.w.data(), b.w.data(), a.w.size() * sizeof(float)), 0) << "trainable weights differ";
  MPI_Barrier(MPI_COMM_WORLD);
  if (rt.rank() == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(path);
}

INSTANTIATE_TEST_SUITE_P(Variants, LoraZero3,
                         ::testing::Values(std::make_tuple(1, CheckpointPolicy::Layer, "embed_tokens,norm,lm_head"),
                                           std::make_tuple(0, CheckpointPolicy::AttentionOutput, "norm"),
                                           std::make_tuple(2, CheckpointPolicy::None, ""),
                                           std::make_tuple(1, CheckpointPolicy::Layer, "")));

// The frozen base keeps its bits; it has no gradient, master copy or Adam state (stage 0 on
// the CPU keeps its f32 weights in master(), for this check).
TEST(LoraTrainer, FrozenBaseBitUnchangedAndTrainableChanges) {
  int argc = 0;
  char** argv = nullptr;
  dist::Runtime rt(&argc, &argv);
  uint64_t seed = 0;
  const std::string path = shared_walk_dir("lora-frozen", seed);
  const StageConfig c = lora_stage(path + "/shard.h5", path + "/run", seed);
  dist::ProcessGroups groups(rt, dist::make_group_layout(c, rt.size(), rt.topology().local_size),
                             dist::CommBackend::Mpi, 120);
  train::Trainer t(c, groups);
  const model::ParamLayout& l = t.model().layout();
  const model::ParamLayout base(t.model().config());
  std::vector<std::vector<float>> before;
  for (const ops::Tensor& m : t.master()) before.emplace_back(m.ptr<float>(), m.ptr<float>() + m.numel());
  for (int64_t s = 0; s < 3; ++s) t.train_step(s);
  const std::vector<ops::Tensor> after = t.master();
  int64_t frozen = 0;
  for (size_t u = 0; u < l.num_units(); ++u) {
    const std::vector<float> now(after[u].ptr<float>(), after[u].ptr<float>() + after[u].numel());
    if (l.units()[u].frozen) {
      ++frozen;
      EXPECT_EQ(now, before[u]) << l.units()[u].name << " changed";
      // ... and it is the base model.init made (random: init_random_range of the base layout)
      std::vector<float> want(now.size());
      model::init_random_range(base, static_cast<size_t>(l.units()[u].tensors[0].base_unit), 0,
                               ops::Tensor(want.data(), ops::DType::F32, {static_cast<int64_t>(want.size())}),
                               c.model.init_std, c.train.seed);
      EXPECT_EQ(now, want) << l.units()[u].name;
      EXPECT_TRUE(t.gradients()[u].empty());
    } else {
      EXPECT_NE(now, before[u]) << l.units()[u].name << " did not train";
    }
  }
  EXPECT_EQ(frozen, t.model().config().num_layers + 0);  // layers (embedding and head: trainable copies)
  MPI_Barrier(MPI_COMM_WORLD);
  if (rt.rank() == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(path);
}

TEST(LoraTrainer, ResumeBitIdenticalTrainableOnlyCheckpointAndRefusals) {
  int argc = 0;
  char** argv = nullptr;
  dist::Runtime rt(&argc, &argv);
  uint64_t seed = 0;
  const std::string path = shared_walk_dir("lora-resume", seed);
  StageConfig c = lora_stage(path + "/shard.h5", path + "/straight", seed);
  c.parallel.zero.stage = rt.size() > 1 ? 3 : 0;
  const LoraRun straight = run(rt, c, 0, 6);
  StageConfig r = c;
  r.output.dir = path + "/resumed";
  const LoraRun first = run(rt, r, 0, 3, 3);
  const LoraRun second = run(rt, r, 3, 6);  // --resume auto
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(first.losses[i], straight.losses[i]) << i;
    EXPECT_EQ(second.losses[i], straight.losses[3 + i]) << 3 + i;
  }
  EXPECT_EQ(std::memcmp(second.w.data(), straight.w.data(), straight.w.size() * sizeof(float)), 0);
  // The checkpoint: trainable arrays and their moments only, and the base it needs.
  const ckpt::CheckpointReader ck(path + "/resumed/checkpoints/step-00000003");
  EXPECT_THROW(ck.numel("master/layer.0"), std::exception);
  EXPECT_EQ(ck.numel("adam_v/lora.layer.1"), ck.numel("master/lora.layer.1"));
  EXPECT_EQ(ck.meta().at("lora").at("rank").as_int(), 4);
  EXPECT_EQ(ck.meta().at("lora").at("base").at("init").as_string(), "random");
  // Another base (init_std) or another lora section: refused, naming the reason.
  StageConfig other = r;
  other.model.init_std = 0.03;
  dist::ProcessGroups groups(rt, dist::make_group_layout(c, rt.size(), rt.topology().local_size),
                             dist::CommBackend::Mpi, 120);
  try {
    train::Trainer t(other, groups);
    ADD_FAILURE() << "resumed on another base";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("adapters only fit the weights they were trained on"), std::string::npos)
        << e.what();
  }
  auto refused = [&](const StageConfig& s) {
    try {
      train::Trainer t(s, groups);
      return false;
    } catch (const InputError&) { return true; }
  };
  other = r;
  other.lora.rank = 8;
  EXPECT_TRUE(refused(other)) << "another lora section";
  other = r;  // a full fine-tune resuming a LoRA checkpoint
  other.lora.rank = 0;
  EXPECT_TRUE(refused(other)) << "a full fine-tune from a LoRA checkpoint";
  // Stage chaining: model.init ckpt: of the LoRA run (base from its index), fresh moments.
  StageConfig next = c;
  next.model.init = "ckpt:" + path + "/resumed";
  next.output.dir = path + "/next";
  next.data.seq_length = 45;
  {
    train::Trainer t(next, groups);
    const std::vector<float> w = trainable_weights(t);
    ASSERT_EQ(w.size(), first.w.size());
    EXPECT_EQ(std::memcmp(w.data(), first.w.data(), w.size() * sizeof(float)), 0) << "the chained start";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rt.rank() == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(path);
}

// Documents of 37 tokens with loss weights, read as windows of 37 (window j: document j and
// the next one's first token, weighted 0): a "none" document weights no token, a "some"
// document random 0/1 and its last token 1. Returns whether each has labels.
std::vector<bool> write_weighted_shard(const std::string& path, uint64_t seed, int docs) {
  std::mt19937_64 rng(seed);
  data::ShardMeta meta;
  meta.tokenizer_name = "synthetic";
  meta.tokenizer_sha256 = std::string(64, '0');
  meta.vocab_size = 256;
  meta.has_loss_weights = true;
  data::TokenShardWriter w(path, meta, 4096);
  const uint16_t src = w.source_index("weighted");
  std::vector<bool> some;
  for (int d = 0; d < docs; ++d) {
    some.push_back(rng() % 2 == 0);
    std::vector<uint32_t> ids(37);
    std::vector<uint8_t> wt(37, 0);
    for (int i = 0; i < 37; ++i) {
      ids[static_cast<size_t>(i)] = static_cast<uint32_t>(3 + rng() % 253);
      wt[static_cast<size_t>(i)] = some.back() && i > 0 && (i == 36 || rng() % 2 == 0);
    }
    w.add_document(ids.data(), ids.size(), src, wt.data());
  }
  w.commit();
  return some;
}

// A step whose batch holds no labelled token makes no update: the adapters and the trainable
// copies keep their bits and Adam's step count stays, so a run that meets such a step before a
// labelled one ends where a run that takes the labelled step alone does, bit for bit.
TEST(LoraTrainer, StepWithoutLabelsLeavesTheAdaptersAlone) {
  int argc = 0;
  char** argv = nullptr;
  dist::Runtime rt(&argc, &argv);
  uint64_t seed = 0;
  const int docs = 200;
  std::vector<bool> some;
  const std::string path = shared_dir(
      "lora-nolabels", seed, [&](const std::string& p) { some = write_weighted_shard(p + "/w.h5", seed, docs); });
  StageConfig c = lora_stage(path + "/w.h5", path + "/met", seed);
  c.train.weight_decay = 0.1;  // (an update with zero gradients would still move the matrices)
  StageConfig alone = c;
  alone.output.dir = path + "/alone";
  // The steps, from the windows each batch of 2 draws.
  const data::WindowSampler sampler(static_cast<uint64_t>(docs) * 37, 37, seed);
  const data::BatchShape shape{2, 1, 1};
  int64_t empty = -1, plain = -1;
  for (int64_t s = 0; s < 4000 && (empty < 0 || plain < 0); ++s) {
    int labelled = 0;
    for (int64_t b = 0; b < 2; ++b)
      labelled += some[static_cast<size_t>(sampler.window_start(data::sample_index(shape, s, 0, 0, b)) / 37)];
    if (labelled == 0 && empty < 0) empty = s;
    if (labelled > 0 && plain < 0 && s >= 5) plain = s;  // (Adam's count of a mistaken s + 1: 6 or more)
  }
  ASSERT_GE(empty, 0);
  ASSERT_GE(plain, 0);
  auto self = dist::make_comm(MPI_COMM_SELF, "self", dist::CommBackend::Mpi, 120);
  train::Trainer t(c, *self, *self), u(alone, *self, *self);
  const std::vector<float> before = trainable_weights(t);
  const train::StepStats st = t.train_step(empty);
  EXPECT_TRUE(st.no_labels);
  EXPECT_EQ(trainable_weights(t), before) << "a step without labels moved the adapters";
  EXPECT_EQ(t.updates(), 0);
  EXPECT_EQ(t.steps_without_labels(), 1);
  const train::StepStats sp = t.train_step(plain);
  EXPECT_FALSE(sp.no_labels);
  EXPECT_FALSE(u.train_step(plain).no_labels);
  EXPECT_EQ(t.updates(), 1);
  const std::vector<float> a = trainable_weights(t), b = trainable_weights(u);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_NE(a, before) << "the labelled step did not train";
  // Adam's first update (step count 1: m and v bias-corrected to g and g^2) moves every element
  // whose gradient is far above eps by lr (plus its decay), no more; a step count of plain + 1
  // (6 to ~120) would move them by 0.5 to 0.98 lr.
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst,
                     (std::abs(double(a[i]) - before[i]) - sp.lr * c.train.weight_decay * std::abs(before[i])) / sp.lr);
  EXPECT_GT(worst, 1.0 - 1e-3) << "the first update was not Adam's first step";
  EXPECT_LT(worst, 1.0 + 1e-3) << "the first update was not Adam's first step";
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
      << "the step without labels changed what the next update did";
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(path);
}

// A 4-rank LoRA checkpoint resumed on 2 ranks (the same global batch): the same losses.
TEST(LoraTrainer, CheckpointReshardsToFewerRanks) {
  int argc = 0;
  char** argv = nullptr;
  dist::Runtime rt(&argc, &argv);
  if (rt.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  uint64_t seed = 0;
  const std::string path = shared_walk_dir("lora-reshard", seed);
  StageConfig c = lora_stage(path + "/shard.h5", path + "/four", seed);
  c.train.batch_size = 1;
  c.parallel.zero.stage = 3;
  const LoraRun four = run(rt, c, 0, 5, 3);
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, rt.rank() < 2 ? 0 : MPI_UNDEFINED, rt.rank(), &sub);
  if (sub != MPI_COMM_NULL) {
    dist::MpiComm comm(sub, "sub", 120);
    StageConfig r = c;
    r.train.grad_accum = 2;
    r.parallel.zero.stage = 0;
    r.output.dir = path + "/two";
    train::RunOptions opts;
    opts.resume = path + "/four";
    train::Trainer t(r, comm, comm, opts);
    EXPECT_EQ(t.start_step(), 3);
    for (int64_t s = 3; s < 5; ++s) {
      const double loss = t.train_step(s).loss;
      EXPECT_NEAR(loss, four.losses[static_cast<size_t>(s)], 1e-5 * loss) << s;
    }
    MPI_Comm_free(&sub);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rt.rank() == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(path);
}

// The logits of a LoRA model (base + trained adapters, in easyctx) against a plain model loaded
// from `merged_dir`, both on the CPU in f32.
double merged_logit_error(const model::LlamaConfig& cfg, const model::ParamLayout& lora,
                          const std::vector<std::vector<float>>& lora_units, const std::string& merged_dir,
                          uint64_t seed) {
  auto be = ops::make_cpu_backend();
  model::ModelOptions lo;
  lo.lora = lora.lora();
  model::LlamaModel ml(cfg, *be, ops::DType::F32, lo), mf(cfg, *be, ops::DType::F32);
  std::vector<ops::Tensor> lp, fp;
  std::vector<std::vector<float>> lu = lora_units, fu;
  for (auto& u : lu) lp.emplace_back(u.data(), ops::DType::F32, std::initializer_list<int64_t>{(int64_t)u.size()});
  for (const auto& u : mf.layout().units()) fu.emplace_back(static_cast<size_t>(u.numel));
  for (auto& u : fu) fp.emplace_back(u.data(), ops::DType::F32, std::initializer_list<int64_t>{(int64_t)u.size()});
  ckpt::load_hf_weights(merged_dir, mf.layout(), fp);
  const int64_t n = 21;
  std::vector<int32_t> tok(n), pos(n), lab(n, -1);
  for (int64_t i = 0; i < n; ++i) {
    tok[i] = static_cast<int32_t>((seed + 7 * i) % cfg.vocab_size);
    pos[i] = static_cast<int32_t>(i);
  }
  model::Batch b{ops::Tensor(tok.data(), ops::DType::I32, {n}), ops::Tensor(pos.data(), ops::DType::I32, {n}),
                 ops::Tensor(lab.data(), ops::DType::I32, {n}), 1, n};
  std::vector<float> x(static_cast<size_t>(n * cfg.vocab_size)), y(x.size());
  ml.forward_logits(lp, b, ops::Tensor(x.data(), ops::DType::F32, {n, cfg.vocab_size}));
  mf.forward_logits(fp, b, ops::Tensor(y.data(), ops::DType::F32, {n, cfg.vocab_size}));
  return rel_error(y, x);
}

TEST(LoraTrainer, PeftExportMergedGivesTheSameLogitsAndAdapterInit) {
  int argc = 0;
  char** argv = nullptr;
  dist::Runtime rt(&argc, &argv);
  if (rt.size() != 1) GTEST_SKIP() << "one rank";
  uint64_t seed = 0;
  const std::string path = shared_walk_dir("lora-export", seed);
  // The base: a random model exported as a Hugging Face folder.
  StageConfig full = tiny_stage(path + "/shard.h5", path + "/base-run");
  full.train.seed = seed;
  full.train.steps = 0;
  auto self = dist::make_comm(MPI_COMM_SELF, "self", dist::CommBackend::Mpi, 120);
  train::Trainer(full, *self, *self).save_hf(path + "/base");
  StageConfig c = lora_stage(path + "/shard.h5", path + "/lora", seed);
  c.model.init = "hf:" + path + "/base";
  c.model.config = "tiny";
  c.output.hf_dtype = "f32";
  std::vector<std::vector<float>> units;
  std::optional<model::ParamLayout> layout;
  {
    train::Trainer t(c, *self, *self);
    for (int64_t s = 0; s < 3; ++s) t.train_step(s);
    t.save_hf(path + "/adapter");
    // base + adapter: the frozen units (the base's f32) and the trained ones
    for (const ops::Tensor& m : t.master()) units.emplace_back(m.ptr<float>(), m.ptr<float>() + m.numel());
    layout.emplace(t.model().layout());
  }
  const Json ac = parse_json(read_file(path + "/adapter/adapter_config.json"), "adapter_config.json");
  EXPECT_EQ(ac.at("peft_type").as_string(), "LORA");
  EXPECT_EQ(ac.at("r").as_int(), 4);
  EXPECT_EQ(ac.at("base_model_name_or_path").as_string(), std::filesystem::absolute(path + "/base").string());
  const ckpt::SafetensorsReader st(path + "/adapter/adapter_model.safetensors");
  EXPECT_TRUE(st.find("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
  EXPECT_TRUE(st.find("base_model.model.model.embed_tokens.weight"));
  EXPECT_TRUE(st.find("base_model.model.lm_head.weight"));
  EXPECT_TRUE(st.find("base_model.model.model.layers.0.input_layernorm.weight"));
  ckpt::ConvertOptions o;
  o.merge_lora = path + "/adapter";
  o.to = "hf:" + path + "/merged";
  o.dtype = ckpt::StDType::F32;
  ckpt::convert_model(o);
  const model::LlamaConfig cfg = model::load_llama_config(path + "/base");
  const double err = merged_logit_error(cfg, *layout, units, path + "/merged", seed);
  std::printf("[accuracy] merged export vs base + adapter: logits rel err %.3g\n", err);
  EXPECT_LT(err, 1e-5);
  // The evaluations' loading: an adapter folder as the model stands for its base with it merged,
  // as does MODEL+adapter:DIR (--adapter): the merged folder's weights, bit for bit.
  {
    auto be = ops::make_cpu_backend();
    const model::ParamLayout base(cfg);
    std::vector<std::vector<float>> want;
    std::vector<ops::Tensor> wv;
    for (const auto& u : base.units()) want.emplace_back(static_cast<size_t>(u.numel));
    for (auto& u : want) wv.emplace_back(u.data(), ops::DType::F32, std::initializer_list<int64_t>{(int64_t)u.size()});
    ckpt::load_hf_weights(path + "/merged", base, wv);
    for (const std::string& spec : {path + "/adapter", eval::with_adapter("hf:" + path + "/base", path + "/adapter")}) {
      const eval::ModelRef ref = eval::resolve_model(spec);
      EXPECT_EQ(ref.adapter, path + "/adapter");
      EXPECT_EQ(ref.label(), "base+adapter");
      const std::vector<ops::Buffer> got = eval::load_model_weights(ref, base, *be, ops::DType::F32);
      for (size_t u = 0; u < want.size(); ++u)
        EXPECT_EQ(std::vector<float>(got[u].flat().ptr<float>(), got[u].flat().ptr<float>() + got[u].numel()), want[u])
            << spec << ": " << base.units()[u].name;
    }
  }
  // model.adapter: a LoRA run starting from the folder holds its values; a full fine-tune from
  // the merged weights holds the merged folder's.
  StageConfig a = c;
  a.model.adapter = path + "/adapter";
  a.output.dir = path + "/from-adapter";
  {
    train::Trainer t(a, *self, *self);
    const std::vector<ops::Tensor> m = t.master();
    for (size_t u = 0; u < units.size(); ++u)
      EXPECT_EQ(std::vector<float>(m[u].ptr<float>(), m[u].ptr<float>() + m[u].numel()), units[u])
          << layout->units()[u].name;
  }
  StageConfig f = full;
  f.model.init = "hf:" + path + "/base";
  f.model.adapter = path + "/adapter";
  f.output.dir = path + "/full-merged";
  {
    train::Trainer t(f, *self, *self);
    std::vector<std::vector<float>> want;
    for (const auto& u : t.model().layout().units()) want.emplace_back(static_cast<size_t>(u.numel));
    std::vector<ops::Tensor> wv;
    for (auto& u : want) wv.emplace_back(u.data(), ops::DType::F32, std::initializer_list<int64_t>{(int64_t)u.size()});
    ckpt::load_hf_weights(path + "/merged", t.model().layout(), wv);
    const std::vector<ops::Tensor> m = t.master();
    for (size_t u = 0; u < want.size(); ++u)
      EXPECT_EQ(std::vector<float>(m[u].ptr<float>(), m[u].ptr<float>() + m[u].numel()), want[u]);
  }
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(path);
}

}  // namespace
}  // namespace easyctx::test
