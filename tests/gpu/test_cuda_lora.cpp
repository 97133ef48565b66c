// LoRA on the CUDA backend (label gpu; every test skips without a CUDA device), against the
// CPU reference (tests/model/test_model_lora.cpp checks that one against float64):
//  1. the bf16 model with the frozen base in bf16 and the adapters on every projection (A and
//     B random, B non-zero), trainable embedding, norms and lm_head, against the fp32 CPU LoRA
//     model on the same weights: loss within 1e-2 relative, every trainable gradient tensor
//     within 3e-2 relative norm error; policies layer, attention_output and none, MLP tiles,
//     head groups, qwen2 and qwen3;
//  2. the CUDA LoRA trainer against the CPU LoRA trainer on the same data: step-0 gradients,
//     five steps' losses and trainable weights; a checkpoint resumes bit for bit; the adapter
//     export reads back as the trainable master weights; ZeRO-3 on one GPU with the frozen base
//     in pinned host memory (offload_params) and the optimizer on the host gives stage 0's
//     losses and trainable weights (1e-5), with a lower device peak;
//  3. the optimizer in host memory (the host AdamW, deferred into the next forward) and split
//     (parallel.zero.offload_optimizer_layers: the last layer's adapters and the head's copies
//     in host memory, the rest on the GPU) give the GPU AdamW's trainable weights bit for bit;
//     the frozen base has no state in either place.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include "ckpt/lora_adapter.h"
#include "ckpt/safetensors.h"
#include "dist/groups.h"
#include "model/llama.h"
#include "ops/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "ops/half.h"
#include "train/train_test_util.h"
#include "train/trainer.h"

namespace easyctx::test {
namespace {

// head_dim 64 (what the CUDA attention takes), GQA 4/2, odd vocabulary.
std::string write_config(const std::string& path, const std::string& family) {
  std::ofstream(path) << "model_type: " << family
                      << "\nhidden_size: 128\nnum_hidden_layers: 2\nnum_attention_heads: 4\n"
                         "num_key_value_heads: 2\nhead_dim: 64\nintermediate_size: 200\nvocab_size: 301\n"
                         "max_position_embeddings: 1024\nrms_norm_eps: 1.0e-5\nrope_theta: 10000.0\n"
                         "tie_word_embeddings: false\nbos_token_id: 1\neos_token_id: 2\n";
  return path;
}

model::LoraSpec every_projection() {
  model::LoraSpec s;
  s.rank = 16;
  s.alpha = 32;
  s.targets.fill(true);
  s.embed_tokens = s.norm = s.lm_head = true;
  return s;
}

struct Variant {
  CheckpointPolicy policy;
  int64_t mlp_tile = 0, head_groups = 1;
};

// Loss and every unit's gradient (host f64; a frozen unit's: empty) of one forward/backward.
std::pair<double, std::vector<std::vector<double>>> run(ops::Backend& be, const model::LlamaConfig& cfg, DType dtype,
                                                        const Variant& v, const std::vector<std::vector<float>>& w,
                                                        const std::vector<int32_t>& ids,
                                                        const std::vector<int32_t>& lab) {
  model::ModelOptions mo;
  mo.checkpoint = v.policy;
  mo.mlp_tile = v.mlp_tile;
  mo.head_groups = v.head_groups;
  mo.lm_head_tile = 37;
  mo.f32_grads = dtype == DType::BF16;
  mo.lora = every_projection();
  model::LlamaModel m(cfg, be, dtype, mo);
  std::vector<Buffer> pb, gb;
  std::vector<Tensor> p, g;
  for (size_t u = 0; u < w.size(); ++u) {
    const int64_t n = static_cast<int64_t>(w[u].size());
    pb.push_back(be.alloc(dtype, n));
    gb.push_back(be.alloc(m.grad_dtype(), n));
    be.copy(pb.back().flat(), Tensor(const_cast<float*>(w[u].data()), DType::F32, {n}));
    p.push_back(pb.back().flat());
    g.push_back(gb.back().flat());
  }
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i % 96);
  Buffer bi = be.alloc(DType::I32, n), bp = be.alloc(DType::I32, n), bl = be.alloc(DType::I32, n);
  be.copy(bi.flat(), Tensor(const_cast<int32_t*>(ids.data()), DType::I32, {n}));
  be.copy(bp.flat(), Tensor(pos.data(), DType::I32, {n}));
  be.copy(bl.flat(), Tensor(const_cast<int32_t*>(lab.data()), DType::I32, {n}));
  const ops::LossSums ls = m.forward_backward(p, g, {bi.flat(), bp.flat(), bl.flat(), 2, n / 2}, 1.0 / 150.0);
  std::vector<std::vector<double>> grads(w.size());
  for (size_t u = 0; u < w.size(); ++u) {
    if (m.layout().units()[u].frozen) continue;
    std::vector<float> h(w[u].size());
    be.copy(Tensor(h.data(), DType::F32, {static_cast<int64_t>(h.size())}), gb[u].flat());
    grads[u].assign(h.begin(), h.end());
  }
  return {ls.sum_nll / static_cast<double>(ls.count), grads};
}

class CudaLoraModel : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaLoraModel, Bf16MatchesCpuFp32) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the CUDA LoRA tests need a GPU";
  TempDir dir("cuda-lora");
  const model::LlamaConfig cfg = model::load_llama_config(write_config(dir / "m.yaml", GetParam()));
  const model::ParamLayout layout(cfg, every_projection());
  std::mt19937_64 rng(test_seed());
  std::normal_distribution<double> nd(0.0, 0.08);
  std::vector<std::vector<float>> w;
  for (const model::ParamUnit& u : layout.units()) {
    w.emplace_back(static_cast<size_t>(u.numel));
    for (const model::ParamTensor& t : u.tensors)  // bf16-representable: both sides see the same weights
      for (int64_t i = 0; i < t.numel; ++i)
        w.back()[static_cast<size_t>(t.offset + i)] =
            ops::bf16_to_float(ops::float_to_bf16(static_cast<float>((t.is_norm ? 1.0 : 0.0) + nd(rng))));
  }
  std::vector<int32_t> ids(192), lab(192);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>(rng() % 301);
    lab[i] = i % 7 == 0 ? -1 : static_cast<int32_t>(rng() % 301);
  }
  auto cpu = ops::make_cpu_backend();
  auto gpu = ops::make_cuda_backend();
  const auto want = run(*cpu, cfg, DType::F32, {CheckpointPolicy::Layer}, w, ids, lab);
  for (const Variant& v : {Variant{CheckpointPolicy::Layer}, Variant{CheckpointPolicy::AttentionOutput, 37},
                           Variant{CheckpointPolicy::None, 0, 2}, Variant{CheckpointPolicy::Layer, 37, 2}}) {
    const auto got = run(*gpu, cfg, DType::BF16, v, w, ids, lab);
    const double le = std::abs(got.first - want.first) / want.first;
    double worst = 0;
    for (size_t u = 0; u < w.size(); ++u)
      if (!want.second[u].empty()) worst = std::max(worst, rel_error(got.second[u], want.second[u]));
    std::printf("[accuracy] lora %s %s tile %lld G%lld: loss rel err %.3g, worst trainable gradient %.3g\n",
                GetParam().c_str(), to_string(v.policy), static_cast<long long>(v.mlp_tile),
                static_cast<long long>(v.head_groups), le, worst);
    EXPECT_LT(le, 1e-2);
    EXPECT_LT(worst, 3e-2);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaLoraModel, ::testing::Values("llama", "qwen2", "qwen3"));

std::vector<double> flat(const std::vector<std::vector<float>>& units) {
  std::vector<double> v;
  for (const auto& u : units) v.insert(v.end(), u.begin(), u.end());
  return v;
}

StageConfig lora_stage(const TempDir& dir, const std::string& out) {
  write_walk_shard(dir / "shard.h5", test_seed(), 80, 20, 150, 256);
  StageConfig c = tiny_stage(dir / "shard.h5", dir / out);
  c.model.config = write_config(dir / "m.yaml", "llama");
  c.model.init_std = 0.05;
  c.data.seq_length = 64;
  c.train.batch_size = 2;
  c.train.lr = 3e-3;
  c.lora.rank = 16;
  c.lora.alpha = 32;
  c.lora.targets = "q_proj,k_proj,v_proj,o_proj";
  c.lora.trainable = "embed_tokens,norm";
  return c;
}

TEST(CudaLoraTrainer, StepsMatchCpuResumeExportAndZero3Offload) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  TempDir dir("cuda-lora-trainer");
  StageConfig c = lora_stage(dir, "cpu");
  StageConfig g = c;
  g.train.device = DeviceKind::Cuda;
  g.output.dir = dir / "gpu";
  auto world = self_comm("world"), dp = self_comm("dp");
  train::Trainer tc(c, *world, *dp), tg(g, *world, *dp);
  EXPECT_EQ(flat(tc.master_host()), flat(tg.master_host()));  // the same start (trainable units)
  tc.compute_gradients(0);
  tg.compute_gradients(0);
  const double e = rel_error(flat(tg.gradients_host()), flat(tc.gradients_host()));
  std::printf("[accuracy] lora trainer step-0 trainable gradients rel err %.3g (tol 3e-2)\n", e);
  EXPECT_LT(e, 3e-2);
  for (int64_t s = 0; s < 5; ++s) {
    const train::StepStats a = tc.train_step(s), b = tg.train_step(s);
    std::printf("[accuracy] lora step %lld loss cpu %.6f cuda %.6f\n", static_cast<long long>(s), a.loss, b.loss);
    EXPECT_LT(std::abs(a.loss - b.loss) / a.loss, 2e-2) << "step " << s;
  }
  EXPECT_LT(rel_error(flat(tg.master_host()), flat(tc.master_host())), 3e-2);
  // A checkpoint resumes bit for bit (train.deterministic).
  tg.save_checkpoint(5);
  const std::vector<double> saved = flat(tg.master_host());
  const double straight = tg.train_step(5).loss;
  train::RunOptions ro;
  ro.resume = g.output.dir;
  {
    train::Trainer tr(g, *world, *dp, ro);
    EXPECT_EQ(flat(tr.master_host()), saved);
    EXPECT_EQ(tr.train_step(5).loss, straight);
    EXPECT_EQ(flat(tr.master_host()), flat(tg.master_host()));
  }
  // The adapter export holds the trainable master weights.
  tg.save_hf(dir / "adapter");
  const ckpt::SafetensorsReader st(dir / "adapter/adapter_model.safetensors");
  const model::ParamLayout& layout = tg.model().layout();
  const std::vector<std::vector<float>> m = tg.master_host();
  for (size_t u = 0; u < layout.num_units(); ++u)
    for (const model::ParamTensor& t : layout.units()[u].tensors) {
      if (layout.units()[u].frozen) continue;
      const ckpt::StTensor* s = st.find(ckpt::peft_key(t));
      ASSERT_NE(s, nullptr) << ckpt::peft_key(t);
      std::vector<float> back(static_cast<size_t>(t.numel));
      st.read(*s, DType::F32, back.data());
      EXPECT_EQ(back, std::vector<float>(m[u].begin() + t.offset, m[u].begin() + t.offset + t.numel));
    }
  // ZeRO-3 on one GPU, the frozen base's shards in pinned host memory, against stage 0.
  StageConfig z = g;
  z.output.dir = dir / "z3";
  z.parallel.zero.stage = 3;
  z.parallel.zero.offload_optimizer = true;
  z.parallel.zero.offload_optimizer_auto = false;
  z.parallel.zero.offload_params = true;
  StageConfig s0 = g;
  s0.output.dir = dir / "s0";
  train::Trainer t0(s0, *world, *dp);
  train::Trainer t3(z, *world, *dp);
  for (int64_t s = 0; s < 3; ++s) EXPECT_NEAR(t3.train_step(s).loss, t0.train_step(s).loss, 1e-5) << "step " << s;
  EXPECT_LT(rel_error(flat(t3.master_host()), flat(t0.master_host())), 1e-5);
  std::printf("[memory] lora stage 0 peak %lld B, zero-3 with the base in host memory %lld B\n",
              static_cast<long long>(t0.memory_stats().peak_bytes),
              static_cast<long long>(t3.memory_stats().peak_bytes));
  EXPECT_LT(t3.memory_stats().peak_bytes, t0.memory_stats().peak_bytes);
}

TEST(CudaLoraTrainer, HostAndSplitOptimizerMatchGpuAdamW) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  TempDir dir("cuda-lora-split");
  StageConfig g = lora_stage(dir, "gpu");
  g.train.device = DeviceKind::Cuda;
  g.train.steps = 6;
  g.train.weight_decay = 0.1;
  g.lora.trainable = "embed_tokens,norm,lm_head";
  auto world = self_comm("world"), dp = self_comm("dp");
  train::Trainer tg(g, *world, *dp);
  for (const int64_t k : {0, 1}) {  // (the model has 2 layers: k = 1 splits)
    StageConfig h = g;
    h.parallel.zero.offload_optimizer = true;
    h.parallel.zero.offload_optimizer_auto = false;
    h.parallel.zero.offload_optimizer_layers = k;
    h.output.dir = dir / ("host" + std::to_string(k));
    train::Trainer th(h, *world, *dp), tr(g, *world, *dp);
    for (int64_t s = 0; s < 4; ++s) {
      const train::StepStats a = tr.train_step(s), b = th.train_step(s);
      std::printf("[lora offload %lld] step %lld loss gpu %.9f host %.9f\n", static_cast<long long>(k),
                  static_cast<long long>(s), a.loss, b.loss);
      EXPECT_EQ(a.loss, b.loss) << "k " << k << " step " << s;
    }
    EXPECT_EQ(flat(th.master_host()), flat(tr.master_host())) << "offload_optimizer_layers " << k;
    EXPECT_NE(flat(th.master_host()), flat(tg.master_host())) << "the weights did not move";
  }
}

}  // namespace
}  // namespace easyctx::test
