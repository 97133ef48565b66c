// The forward-only path of the evaluations (LlamaModel::forward_score) against the training
// forward: the same NLL bits on the CPU in f32 (for tied and untied models, tiled and untiled
// MLP and LM head, labels with holes), its argmax flags against the logits, and the golden
// fixtures of Hugging Face transformers (loss and argmax).
#include <algorithm>
#include <cmath>
#include <random>

#include "ckpt/hf_model.h"
#include "ckpt/safetensors.h"
#include "llama_test_util.h"
#include "model/llama.h"
#include "test_util.h"

namespace easyctx::test {
namespace {

using ops::DType;
using ops::Tensor;

model::LlamaConfig small_config(bool tied) {
  model::LlamaConfig c = llama_config("small", {32, 3, 4, 2, 8, 40, 97});
  c.rope_theta = 500.0;
  c.tie_word_embeddings = tied;
  return c;
}

// (tied, MLP tile, LM-head tile)
class ForwardScore : public ::testing::TestWithParam<std::tuple<bool, int64_t, int64_t>> {};

TEST_P(ForwardScore, EqualsTheTrainingForwardLoss) {
  const auto [tied, mlp_tile, head_tile] = GetParam();
  std::mt19937_64 rng(test_seed());
  const model::LlamaConfig cfg = small_config(tied);
  auto be = ops::make_cpu_backend();
  model::ModelOptions mo;
  mo.mlp_tile = mlp_tile;
  mo.lm_head_tile = head_tile;
  model::LlamaModel m(cfg, *be, DType::F32, mo);
  std::vector<ops::Buffer> pb;
  std::vector<Tensor> p;
  for (const auto& u : m.layout().units()) {
    pb.push_back(be->alloc(DType::F32, u.numel));
    p.push_back(pb.back().flat());
  }
  model::init_random(m.layout(), p, 0.5, test_seed());
  // Two lengths, the longer first (the workspace is kept and reused for the shorter one).
  for (const auto& [B, S] : {std::pair<int64_t, int64_t>{2, 37}, std::pair<int64_t, int64_t>{1, 23}}) {
    const int64_t n = B * S;
    std::vector<int32_t> tok(n), pos(n), lab(n);
    for (int64_t i = 0; i < n; ++i) {
      tok[i] = static_cast<int32_t>(rng() % cfg.vocab_size);
      lab[i] = (i % 7 == 2 || i < 3) ? -1 : static_cast<int32_t>(rng() % cfg.vocab_size);
      pos[i] = static_cast<int32_t>(i % S + (i / S) * 11);
    }
    model::Batch b{Tensor(tok.data(), DType::I32, {n}), Tensor(pos.data(), DType::I32, {n}),
                   Tensor(lab.data(), DType::I32, {n}), B, S};
    // Half the labels are the model's argmax (from the logits of the training forward).
    std::vector<float> logits(static_cast<size_t>(n * cfg.vocab_size));
    m.forward_logits(p, b, Tensor(logits.data(), DType::F32, {n, cfg.vocab_size}));
    for (int64_t i = 0; i < n; i += 2) {
      if (lab[i] < 0) continue;
      const float* l = logits.data() + i * cfg.vocab_size;
      lab[i] = static_cast<int32_t>(std::max_element(l, l + cfg.vocab_size) - l);
    }
    const ops::LossSums ref = m.forward_loss(p, b);
    std::vector<double> nll(n, -1);
    std::vector<int32_t> top(n, -1);
    if (B == 2) m.release_workspace();
    const int64_t before = be->memory_stats().live_bytes;
    m.forward_score(p, b, Tensor(nll.data(), DType::F64, {n}), Tensor(top.data(), DType::I32, {n}));
    // Its workspace: what score_workspace_specs lists for the longest batch, kept for the shorter one.
    int64_t bytes = 0;
    for (const auto& spec : model::LlamaModel::score_workspace_specs(cfg, mo, DType::F32, B, S))
      bytes += spec.numel * static_cast<int64_t>(ops::element_size(spec.dtype));
    EXPECT_EQ(be->memory_stats().live_bytes - before, B == 2 ? bytes : 0);
    double sum = 0;
    int64_t count = 0, hits = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (lab[i] < 0) {
        EXPECT_EQ(nll[i], 0.0);
        EXPECT_EQ(top[i], 0);
        continue;
      }
      sum += nll[i];
      ++count;
      const float* l = logits.data() + i * cfg.vocab_size;
      const int32_t arg = static_cast<int32_t>(std::max_element(l, l + cfg.vocab_size) - l);
      EXPECT_EQ(top[i], arg == lab[i] ? 1 : 0) << "row " << i;
      hits += top[i];
    }
    EXPECT_EQ(count, ref.count);
    EXPECT_NEAR(sum, ref.sum_nll, 1e-6 * std::abs(ref.sum_nll));
    EXPECT_EQ(sum, ref.sum_nll) << "the same ops in the same order give the same bits";
    EXPECT_GT(hits, count / 3);
  }
}

INSTANTIATE_TEST_SUITE_P(All, ForwardScore,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(int64_t{0}, int64_t{5}),
                                            ::testing::Values(int64_t{3}, int64_t{4096})));

// The golden fixtures (tests/golden): HF's loss from the scored rows' NLL, HF's argmax.
TEST(ForwardScoreGolden, MatchesTransformers) {
  for (const std::string name : {"gqa", "tied_llama3", "gqa_hd64"}) {
    SCOPED_TRACE(name);
    const std::string dir = source_dir() + "/tests/golden/data/" + name;
    const model::LlamaConfig cfg = model::load_llama_config(dir + "/model");
    ckpt::SafetensorsReader io(dir + "/io.safetensors");
    auto get = [&](const std::string& t) {
      const ckpt::StTensor* st = io.find(t);
      std::vector<double> v(static_cast<size_t>(st->numel()));
      io.read(*st, DType::F64, v.data());
      return v;
    };
    auto ints = [&](const std::string& t) {
      std::vector<int32_t> v;
      for (double x : get(t)) v.push_back(static_cast<int32_t>(std::lround(x)));
      return v;
    };
    auto be = ops::make_cpu_backend();
    model::LlamaModel m(cfg, *be, DType::F32, {CheckpointPolicy::Layer, 7});
    std::vector<ops::Buffer> pb;
    std::vector<Tensor> p;
    for (const auto& u : m.layout().units()) {
      pb.push_back(be->alloc(DType::F32, u.numel));
      p.push_back(pb.back().flat());
    }
    ckpt::load_hf_weights(dir + "/model", m.layout(), p);
    std::vector<int32_t> ids = ints("input_ids"), pos = ints("position_ids"), lab = ints("labels");
    const int64_t B = 2, S = static_cast<int64_t>(ids.size()) / 2, n = B * S, V = cfg.vocab_size;
    model::Batch b{Tensor(ids.data(), DType::I32, {n}), Tensor(pos.data(), DType::I32, {n}),
                   Tensor(lab.data(), DType::I32, {n}), B, S};
    std::vector<double> nll(n);
    std::vector<int32_t> top(n);
    m.forward_score(p, b, Tensor(nll.data(), DType::F64, {n}), Tensor(top.data(), DType::I32, {n}));
    double sum = 0;
    int64_t count = 0, checked = 0;
    const std::vector<double> logits = get("logits");
    for (int64_t i = 0; i < n; ++i) {
      if (lab[i] < 0) continue;
      sum += nll[i];
      ++count;
      std::vector<double> l(logits.begin() + i * V, logits.begin() + (i + 1) * V);
      const int64_t arg = std::max_element(l.begin(), l.end()) - l.begin();
      std::vector<double> s = l;
      std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<double>());
      if (s[0] - s[1] < 1e-4) continue;  // a near tie: f32 may pick either
      EXPECT_EQ(top[i], arg == lab[i] ? 1 : 0) << "row " << i;
      ++checked;
    }
    const double want = get("loss")[0];
    EXPECT_NEAR(sum / static_cast<double>(count), want, std::abs(want) * 1e-5);
    EXPECT_GT(checked, count / 2);
  }
}

}  // namespace
}  // namespace easyctx::test

namespace easyctx::test {
namespace {

// A model made a chunk at a time (random:SPEC evaluations) has init_random's values.
TEST(InitRandomRange, ChunksEqualTheWholeInitialisation) {
  const model::LlamaConfig cfg = small_config(false);
  const model::ParamLayout layout(cfg);
  std::vector<std::vector<float>> whole;
  std::vector<Tensor> views;
  for (const auto& u : layout.units()) {
    whole.emplace_back(static_cast<size_t>(u.numel));
    views.emplace_back(whole.back().data(), DType::F32, std::initializer_list<int64_t>{u.numel});
  }
  model::init_random(layout, views, 0.02, 99);
  for (size_t u = 0; u < layout.num_units(); ++u) {
    const int64_t n = layout.units()[u].numel;
    for (int64_t off = 0; off < n; off += 1000) {
      const int64_t len = std::min<int64_t>(1000, n - off);
      std::vector<float> part(static_cast<size_t>(len));
      model::init_random_range(layout, u, off, Tensor(part.data(), DType::F32, {len}), 0.02, 99);
      for (int64_t i = 0; i < len; ++i)
        ASSERT_EQ(part[i], whole[u][off + i]) << layout.units()[u].name << " " << off + i;
    }
  }
}

}  // namespace
}  // namespace easyctx::test
