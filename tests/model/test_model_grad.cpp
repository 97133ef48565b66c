// The whole Llama backward against central finite differences in fp64 (odd tiny shapes,
// GQA, tied and untied, qwen2's q/k/v biases, every activation policy, MLP untiled and tiled), the parameter
// layout, and the workspace specs against what the model really allocates.
#include <cmath>
#include <random>

#include "llama_test_util.h"
#include "model/llama.h"
#include "test_util.h"

namespace easyctx::test {
namespace {

using ops::DType;

// family: "llama", "qwen2" (q/k/v biases), "qwen3" (per-head q/k norms), "mistral" (a
// sliding window of 3), "qwen2_window" (qwen2 with a window of 2 in its second layer only) or
// "dynamic" (rope_scaling dynamic, factor 3, max_position_embeddings 10: the batch's positions
// reach 21, so the base is rescaled).
model::LlamaConfig odd_config(bool tied, const std::string& family = "llama") {
  model::LlamaConfig c = llama_config("odd", {12, 2, 3, 1, 6, 10, 11});
  c.rope_theta = 100.0;
  c.tie_word_embeddings = tied;
  c.model_type = family == "qwen2_window" ? "qwen2" : family == "dynamic" ? "llama" : family;
  c.qkv_bias = c.model_type == "qwen2";
  c.qk_norm = family == "qwen3";
  c.sliding_window = family == "mistral" ? 3 : family == "qwen2_window" ? 2 : 0;  // of the 5 tokens of each sequence
  if (family == "qwen2_window") c.sliding_layers = {false, true};
  if (family == "dynamic") {
    c.rope_scaling.kind = model::RopeScalingKind::Dynamic;
    c.rope_scaling.factor = 3.0;
    c.max_position_embeddings = 10;
  }
  return c;
}

// (tied, activation policy, MLP tile: 0 = untiled, 3 = four tiles of the 10 tokens, the last
// short, model family)
class ModelGrad : public ::testing::TestWithParam<std::tuple<bool, CheckpointPolicy, int64_t, std::string>> {};

TEST_P(ModelGrad, MatchesFiniteDifferences) {
  const auto [tied, policy, mlp_tile, family] = GetParam();
  std::mt19937_64 rng(test_seed());
  const model::LlamaConfig cfg = odd_config(tied, family);
  auto be = ops::make_cpu_backend();
  model::LlamaModel m(cfg, *be, DType::F64, {policy, 3, mlp_tile});
  std::vector<ops::Buffer> pb, gb;
  std::vector<ops::Tensor> p, g;
  std::normal_distribution<double> nd(0.0, 0.5);
  for (const auto& u : m.layout().units()) {
    pb.push_back(be->alloc(DType::F64, u.numel));
    gb.push_back(be->alloc(DType::F64, u.numel));
    for (const auto& t : u.tensors)
      for (int64_t i = 0; i < t.numel; ++i)
        pb.back().flat().ptr<double>()[t.offset + i] = (t.is_norm ? 1.0 : 0.0) + nd(rng);
    p.push_back(pb.back().flat());
    g.push_back(gb.back().flat());
  }
  const int64_t B = 2, S = 5;
  std::vector<int32_t> tok(B * S), pos(B * S), lab(B * S);
  for (int64_t i = 0; i < B * S; ++i) {
    tok[i] = static_cast<int32_t>(rng() % cfg.vocab_size);
    lab[i] = i % 4 == 3 ? -1 : static_cast<int32_t>(rng() % cfg.vocab_size);
    pos[i] = static_cast<int32_t>(i % S + (i / S) * 17);
  }
  model::Batch b{ops::Tensor(tok.data(), DType::I32, {B * S}), ops::Tensor(pos.data(), DType::I32, {B * S}),
                 ops::Tensor(lab.data(), DType::I32, {B * S}), B, S};
  const double scale = 0.3;
  m.forward_backward(p, g, b, scale);
  auto f = [&] { return scale * m.forward_loss(p, b).sum_nll; };
  for (size_t u = 0; u < p.size(); ++u)
    for (const auto& t : m.layout().units()[u].tensors) {
      double worst = 0;
      for (int s = 0; s < 6; ++s) {
        const int64_t i = t.offset + static_cast<int64_t>(rng() % static_cast<uint64_t>(t.numel));
        double* x = p[u].ptr<double>() + i;
        // Five-point central difference (truncation O(h^4)): with random weights of std 0.5
        // the three-point one's O(h^2) term alone reached 2e-6 relative on small gradients.
        const double x0 = *x, h = 1e-4;
        auto at = [&](double dx) {
          *x = x0 + dx;
          const double y = f();
          *x = x0;
          return y;
        };
        const double num = (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h);
        const double ana = g[u].ptr<double>()[i];
        worst = std::max(worst, std::abs(num - ana) / std::max({std::abs(num), std::abs(ana), 1e-3}));
      }
      EXPECT_LT(worst, 1e-6) << t.hf_name;
    }
}

INSTANTIATE_TEST_SUITE_P(All, ModelGrad,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(CheckpointPolicy::None, CheckpointPolicy::Layer,
                                                              CheckpointPolicy::AttentionOutput),
                                            ::testing::Values(int64_t{0}, int64_t{3}),
                                            ::testing::Values("llama", "qwen2", "qwen3", "mistral", "qwen2_window",
                                                              "dynamic")));

TEST(ParamLayout, UnitsAndOffsets) {
  const model::ParamLayout untied(odd_config(false)), tied(odd_config(true));
  ASSERT_EQ(untied.num_units(), 4u);  // embed, 2 layers, head
  EXPECT_EQ(untied.units()[untied.head_unit()].tensors.size(), 2u);
  EXPECT_EQ(tied.units()[tied.head_unit()].tensors.size(), 1u);
  const model::ParamUnit& l1 = untied.units()[untied.layer_unit(1)];
  EXPECT_EQ(l1.tensors[model::kQ].offset, 0);
  EXPECT_EQ(l1.tensors[model::kK].offset, 18 * 12);
  EXPECT_EQ(l1.tensors[model::kAttnNorm].hf_name, "model.layers.1.input_layernorm.weight");
  EXPECT_FALSE(l1.tensors[model::kMlpNorm].decay);
  EXPECT_TRUE(l1.tensors[model::kDown].decay);
  int64_t total = 0;
  for (const auto& t : l1.tensors) total += t.numel;
  EXPECT_EQ(total, l1.numel);
  EXPECT_EQ(untied.total_numel(), odd_config(false).num_parameters());
  EXPECT_EQ(tied.total_numel(), odd_config(true).num_parameters());
  size_t u = 0, t = 0;
  EXPECT_TRUE(untied.find("lm_head.weight", u, t));
  EXPECT_FALSE(tied.find("lm_head.weight", u, t));
  // qwen2: the q/k/v biases after the norms, zero-initialised, without weight decay.
  const model::ParamLayout qwen(odd_config(false, "qwen2"));
  const model::ParamUnit& q1 = qwen.units()[qwen.layer_unit(1)];
  ASSERT_EQ(q1.tensors.size(), static_cast<size_t>(model::kLayerTensors) - 2);  // no q/k norms
  EXPECT_EQ(q1.tensors[model::kQBias].hf_name, "model.layers.1.self_attn.q_proj.bias");
  EXPECT_EQ(q1.tensors[model::kVBias].shape, std::vector<int64_t>{6});
  EXPECT_TRUE(q1.tensors[model::kKBias].is_bias);
  EXPECT_FALSE(q1.tensors[model::kKBias].decay);
  EXPECT_EQ(q1.numel, l1.numel + 18 + 6 + 6);
  EXPECT_EQ(qwen.total_numel(), odd_config(false, "qwen2").num_parameters());
  // qwen3: the q and k norms (one gain per head dimension) after the norms, no biases.
  const model::ParamLayout q3(odd_config(false, "qwen3"));
  const model::ParamUnit& l3 = q3.units()[q3.layer_unit(0)];
  EXPECT_EQ(l3.tensors[q3.layer_slot(model::kKNorm)].hf_name, "model.layers.0.self_attn.k_norm.weight");
  EXPECT_TRUE(l3.tensors[q3.layer_slot(model::kQNorm)].is_norm);
  EXPECT_EQ(l3.numel, l1.numel + 2 * 6);
  EXPECT_THROW(q3.layer_slot(model::kQBias), Error);
  EXPECT_EQ(q3.total_numel(), odd_config(false, "qwen3").num_parameters());
}

}  // namespace
}  // namespace easyctx::test
