// LoRA (lora: section; lib/model/lora.h) against float64 references of its own:
//  - the chain rule through the full model: a LoRA model's loss is the full model's at
//    W + scale B A (the trainable copies' values in place of the base's tensors), and every
//    trainable gradient follows from the full model's gradient G_W (itself checked against
//    finite differences in test_model_grad): dA = scale B^T G_W, dB = scale G_W A^T, a copy's
//    = its tensor's; for every target set, trainable extras, family, policy, head groups and
//    MLP tiles, every element, to 1e-10 relative;
//  - five-point central differences on the LoRA model itself (sampled elements of every
//    trainable tensor), which share nothing with the chain-rule reference;
//  - the frozen units' gradients are never written; the f32 model agrees with the f64 one;
//  - the layout: units, names, shapes, locations, PEFT's initialisation.
#include <cmath>
#include <random>

#include "llama_test_util.h"
#include "model/llama.h"
#include "test_util.h"

namespace easyctx::test {
namespace {

using model::LoraSpec;
using ops::DType;

struct LoraCase {
  std::string name;
  std::string family = "llama";
  bool tied = false;
  std::vector<int> targets;  // LoraTarget values
  bool embed = false, norm = false, lm_head = false;
  CheckpointPolicy policy = CheckpointPolicy::Layer;
  int64_t groups = 1, mlp_tile = 0;
};

std::ostream& operator<<(std::ostream& os, const LoraCase& c) { return os << c.name; }

// GQA 4/2 (head groups of 2 possible), odd sizes elsewhere.
model::LlamaConfig lora_config(const LoraCase& c) {
  model::LlamaConfig m = llama_config("lora", {16, 2, 4, 2, 4, 10, 13});
  m.rope_theta = 100.0;
  m.tie_word_embeddings = c.tied;
  m.model_type = c.family;
  m.qkv_bias = c.family == "qwen2";
  m.qk_norm = c.family == "qwen3";
  return m;
}

LoraSpec spec_of(const LoraCase& c) {
  LoraSpec s;
  s.rank = 3;
  s.alpha = 5;
  for (int t : c.targets) s.targets[static_cast<size_t>(t)] = true;
  s.embed_tokens = c.embed;
  s.norm = c.norm;
  s.lm_head = c.lm_head;
  return s;
}

struct Units {
  std::vector<ops::Buffer> bufs;
  std::vector<ops::Tensor> views;
  double* at(size_t u) { return views[u].ptr<double>(); }
};

Units alloc_units(ops::Backend& be, const model::ParamLayout& l, DType t) {
  Units x;
  for (const auto& u : l.units()) {
    x.bufs.push_back(be.alloc(t, u.numel));
    x.views.push_back(x.bufs.back().flat());
  }
  return x;
}

// The LoRA layout's units from the base's (frozen units and, unless `fresh`, copies from it;
// fresh: trainable copies and adapters random), never zeros.
void fill_lora(const model::ParamLayout& l, Units& lora, Units& base, std::mt19937_64& rng) {
  std::normal_distribution<double> nd(0.0, 0.5);
  for (size_t u = 0; u < l.num_units(); ++u)
    for (const auto& t : l.units()[u].tensors)
      for (int64_t i = 0; i < t.numel; ++i) {
        double& v = lora.at(u)[t.offset + i];
        if (l.units()[u].frozen) v = base.at(static_cast<size_t>(t.base_unit))[t.base_offset + i];
        else v = (t.is_norm ? 1.0 : 0.0) + nd(rng);
      }
}

// The full model the LoRA one computes: base with W += scale B A and the copies in place.
void merged(const model::ParamLayout& lora, const model::ParamLayout& base, Units& lu, Units& full, int64_t L) {
  const LoraSpec& s = lora.lora();
  for (size_t u = 0; u < lora.num_units(); ++u)
    for (const auto& t : lora.units()[u].tensors)
      if (!t.adapter && !lora.units()[u].frozen)
        std::copy(lu.at(u) + t.offset, lu.at(u) + t.offset + t.numel,
                  full.at(static_cast<size_t>(t.base_unit)) + t.base_offset);
  for (int64_t l = 0; l < L; ++l)
    for (int tg = 0; tg < model::kLoraTargets; ++tg) {
      const auto a = lora.lora_matrix(l, tg, true), b = lora.lora_matrix(l, tg, false);
      if (!a.found()) continue;
      const auto& ta = lora.units()[a.unit].tensors[a.tensor];
      const auto& tb = lora.units()[b.unit].tensors[b.tensor];
      const int64_t r = s.rank, in = ta.shape[1], out = tb.shape[0];
      const size_t bu = base.layer_unit(l);
      double* w = full.at(bu) + base.units()[bu].tensors[base.layer_slot(static_cast<model::LayerTensor>(tg))].offset;
      for (int64_t i = 0; i < out; ++i)
        for (int64_t j = 0; j < in; ++j) {
          double sum = 0;
          for (int64_t k = 0; k < r; ++k)
            sum += lu.at(b.unit)[tb.offset + i * r + k] * lu.at(a.unit)[ta.offset + k * in + j];
          w[i * in + j] += s.scale() * sum;
        }
    }
}

// The gradient each trainable LoRA tensor must have, from the full model's gradients g.
std::vector<double> expected_grad(const model::ParamLayout& lora, const model::ParamLayout& base, Units& lu, Units& g,
                                  size_t u, const model::ParamTensor& t, int64_t L) {
  std::vector<double> e(static_cast<size_t>(t.numel), 0.0);
  if (!t.adapter) {
    std::copy(g.at(static_cast<size_t>(t.base_unit)) + t.base_offset,
              g.at(static_cast<size_t>(t.base_unit)) + t.base_offset + t.numel, e.begin());
    return e;
  }
  for (int64_t l = 0; l < L; ++l)
    for (int tg = 0; tg < model::kLoraTargets; ++tg) {
      const auto a = lora.lora_matrix(l, tg, true), b = lora.lora_matrix(l, tg, false);
      if (!a.found() || a.unit != u) continue;
      const auto& ta = lora.units()[a.unit].tensors[a.tensor];
      const auto& tb = lora.units()[b.unit].tensors[b.tensor];
      if (t.hf_name != ta.hf_name && t.hf_name != tb.hf_name) continue;
      const int64_t r = lora.lora().rank, in = ta.shape[1], out = tb.shape[0];
      const size_t bu = base.layer_unit(l);
      const double* gw =
          g.at(bu) + base.units()[bu].tensors[base.layer_slot(static_cast<model::LayerTensor>(tg))].offset;
      const double* A = lu.at(a.unit) + ta.offset;
      const double* B = lu.at(b.unit) + tb.offset;
      const double s = lora.lora().scale();
      for (int64_t i = 0; i < out; ++i)
        for (int64_t j = 0; j < in; ++j)
          for (int64_t k = 0; k < r; ++k) {
            if (t.lora_a) e[static_cast<size_t>(k * in + j)] += s * B[i * r + k] * gw[i * in + j];
            else e[static_cast<size_t>(i * r + k)] += s * gw[i * in + j] * A[k * in + j];
          }
    }
  return e;
}

class ModelLora : public ::testing::TestWithParam<LoraCase> {};

TEST_P(ModelLora, GradientsAreTheFullModelsThroughTheChainRuleAndFiniteDifferences) {
  const LoraCase c = GetParam();
  std::mt19937_64 rng(test_seed());
  const model::LlamaConfig cfg = lora_config(c);
  auto be = ops::make_cpu_backend();
  model::ModelOptions lo{c.policy, 3, c.mlp_tile};
  lo.head_groups = c.groups;
  lo.lora = spec_of(c);
  model::ModelOptions fo = lo;
  fo.lora = LoraSpec{};
  model::LlamaModel ml(cfg, *be, DType::F64, lo), mf(cfg, *be, DType::F64, fo);
  const model::ParamLayout &ll = ml.layout(), &bl = mf.layout();
  Units base = alloc_units(*be, bl, DType::F64), full = alloc_units(*be, bl, DType::F64);
  Units lp = alloc_units(*be, ll, DType::F64), lg = alloc_units(*be, ll, DType::F64);
  Units fg = alloc_units(*be, bl, DType::F64);
  std::normal_distribution<double> nd(0.0, 0.5);
  for (size_t u = 0; u < bl.num_units(); ++u)
    for (const auto& t : bl.units()[u].tensors)
      for (int64_t i = 0; i < t.numel; ++i) base.at(u)[t.offset + i] = (t.is_norm ? 1.0 : 0.0) + nd(rng);
  fill_lora(ll, lp, base, rng);
  for (size_t u = 0; u < bl.num_units(); ++u) std::copy(base.at(u), base.at(u) + bl.units()[u].numel, full.at(u));
  merged(ll, bl, lp, full, cfg.num_layers);
  for (size_t u = 0; u < ll.num_units(); ++u)  // a frozen unit's gradient must stay as it is
    std::fill(lg.at(u), lg.at(u) + ll.units()[u].numel, ll.units()[u].frozen ? 7.0 : 0.0);

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
  const double loss_l = ml.forward_backward(lp.views, lg.views, b, scale).sum_nll;
  const double loss_f = mf.forward_backward(full.views, fg.views, b, scale).sum_nll;
  EXPECT_NEAR(loss_l, loss_f, 1e-12 * std::abs(loss_f)) << "the LoRA model's loss is the merged model's";
  for (size_t u = 0; u < ll.num_units(); ++u) {
    if (ll.units()[u].frozen) {
      for (int64_t i = 0; i < ll.units()[u].numel; ++i) ASSERT_EQ(lg.at(u)[i], 7.0) << ll.units()[u].name;
      continue;
    }
    for (const auto& t : ll.units()[u].tensors) {
      const std::vector<double> e = expected_grad(ll, bl, lp, fg, u, t, cfg.num_layers);
      const std::vector<double> got(lg.at(u) + t.offset, lg.at(u) + t.offset + t.numel);
      EXPECT_LT(rel_error(got, e), 1e-10) << t.hf_name;
    }
  }
  // Finite differences on the LoRA model alone, a few elements of every trainable tensor: a
  // sanity check beside the chain rule's 1e-10 above. With h = 1e-4 the five-point rule's
  // truncation reached 3.5e-5 on some draws (weights of std 0.5 give sharp softmaxes); with
  // h = 1e-5 the worst in ten runs of the 20 cases was 4.6e-7 (rounding), hence 1e-5.
  auto f = [&] { return scale * ml.forward_loss(lp.views, b).sum_nll; };
  for (size_t u = 0; u < ll.num_units(); ++u) {
    if (ll.units()[u].frozen) continue;
    for (const auto& t : ll.units()[u].tensors) {
      double worst = 0;
      for (int k = 0; k < 4; ++k) {
        double* x = lp.at(u) + t.offset + static_cast<int64_t>(rng() % static_cast<uint64_t>(t.numel));
        const double x0 = *x, h = 1e-5;
        auto at = [&](double dx) {
          *x = x0 + dx;
          const double y = f();
          *x = x0;
          return y;
        };
        const double num = (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h);
        const double ana = lg.at(u)[x - lp.at(u)];
        worst = std::max(worst, std::abs(num - ana) / std::max({std::abs(num), std::abs(ana), 1e-3}));
      }
      EXPECT_LT(worst, 1e-5) << t.hf_name;
    }
  }
}

std::vector<LoraCase> cases() {
  using namespace model;
  std::vector<LoraCase> v;
  const char* names[] = {"q", "k", "v", "o", "gate", "up", "down"};
  for (int t = 0; t < kLoraTargets; ++t)
    v.push_back({std::string("only_") + names[t], "llama", false, {t}, true, true});
  const std::vector<int> all{kLoraQ, kLoraK, kLoraV, kLoraO, kLoraGate, kLoraUp, kLoraDown};
  const std::vector<int> attn{kLoraQ, kLoraK, kLoraV, kLoraO}, mlp{kLoraGate, kLoraUp, kLoraDown};
  v.push_back({"attention_none_extra", "llama", false, attn});
  v.push_back({"mlp_lm_head", "llama", false, mlp, false, false, true});
  v.push_back({"all_everything", "llama", false, all, true, true, true});
  v.push_back({"all_policy_none", "llama", false, all, true, true, false, CheckpointPolicy::None});
  v.push_back({"all_attention_output", "llama", false, all, false, true, false, CheckpointPolicy::AttentionOutput});
  v.push_back({"all_mlp_tiles", "llama", false, all, true, false, false, CheckpointPolicy::Layer, 1, 3});
  v.push_back({"attn_head_groups", "llama", false, attn, false, true, false, CheckpointPolicy::Layer, 2});
  v.push_back({"all_head_groups_none", "llama", false, all, true, true, false, CheckpointPolicy::None, 2});
  v.push_back({"all_head_groups_attention_output", "llama", false, all, false, false, false,
               CheckpointPolicy::AttentionOutput, 2, 3});
  v.push_back({"qwen2_all", "qwen2", true, all, false, true});
  v.push_back({"qwen3_all", "qwen3", true, all, false, true});
  v.push_back({"qwen3_head_groups", "qwen3", false, attn, true, true, true, CheckpointPolicy::Layer, 2});
  v.push_back({"tied_norm", "llama", true, all, false, true});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, ModelLora, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<LoraCase>& i) { return i.param.name; });

// The f32 model (the CPU trainer's) against the f64 one on the same values.
TEST(ModelLoraF32, AgreesWithF64) {
  std::mt19937_64 rng(test_seed());
  LoraCase c{"f32", "llama", false, {0, 1, 2, 3, 4, 5, 6}, true, true, true};
  const model::LlamaConfig cfg = lora_config(c);
  auto be = ops::make_cpu_backend();
  model::ModelOptions o;
  o.lora = spec_of(c);
  model::LlamaModel m64(cfg, *be, DType::F64, o), m32(cfg, *be, DType::F32, o);
  const model::ParamLayout& l = m64.layout();
  Units p64 = alloc_units(*be, l, DType::F64), g64 = alloc_units(*be, l, DType::F64);
  Units p32 = alloc_units(*be, l, DType::F32), g32 = alloc_units(*be, l, DType::F32);
  std::normal_distribution<double> nd(0.0, 0.3);
  for (size_t u = 0; u < l.num_units(); ++u)
    for (const auto& t : l.units()[u].tensors)
      for (int64_t i = 0; i < t.numel; ++i) {
        const float v = static_cast<float>((t.is_norm ? 1.0 : 0.0) + nd(rng));
        p64.at(u)[t.offset + i] = v;
        p32.views[u].ptr<float>()[t.offset + i] = v;
      }
  const int64_t n = 12;
  std::vector<int32_t> tok(n), pos(n), lab(n);
  for (int64_t i = 0; i < n; ++i) {
    tok[i] = static_cast<int32_t>(rng() % cfg.vocab_size);
    lab[i] = static_cast<int32_t>(rng() % cfg.vocab_size);
    pos[i] = static_cast<int32_t>(i);
  }
  model::Batch b{ops::Tensor(tok.data(), DType::I32, {n}), ops::Tensor(pos.data(), DType::I32, {n}),
                 ops::Tensor(lab.data(), DType::I32, {n}), 1, n};
  const double a = m64.forward_backward(p64.views, g64.views, b, 1.0).sum_nll;
  const double f = m32.forward_backward(p32.views, g32.views, b, 1.0).sum_nll;
  EXPECT_NEAR(a, f, 1e-5 * a);
  for (size_t u = 0; u < l.num_units(); ++u) {
    if (l.units()[u].frozen) continue;
    std::vector<double> x(g64.at(u), g64.at(u) + l.units()[u].numel);
    std::vector<double> y(g32.views[u].ptr<float>(), g32.views[u].ptr<float>() + l.units()[u].numel);
    EXPECT_LT(rel_error(y, x), 1e-4) << l.units()[u].name;
  }
}

TEST(LoraLayout, UnitsNamesAndLocations) {
  LoraCase c{"layout", "qwen3", false, {model::kLoraQ, model::kLoraDown}, true, true, false};
  const model::LlamaConfig cfg = lora_config(c);
  const model::ParamLayout l(cfg, spec_of(c)), base(cfg);
  // embed (trained: left out), 2 frozen layers, frozen head (lm_head frozen), then lora.embed,
  // lora.layer.0, lora.layer.1, lora.head (the final norm).
  ASSERT_EQ(l.num_units(), 7u);
  EXPECT_EQ(l.embed_unit(), model::ParamLayout::kNone);
  EXPECT_EQ(l.units()[l.layer_unit(0)].name, "layer.0");
  EXPECT_TRUE(l.units()[l.layer_unit(1)].frozen && l.units()[l.layer_unit(1)].per_layer);
  EXPECT_TRUE(l.units()[l.head_unit()].frozen);
  EXPECT_EQ(l.units()[l.embedding().unit].name, "lora.embed");
  EXPECT_FALSE(l.units()[l.embedding().unit].frozen);
  EXPECT_EQ(l.units()[l.final_norm().unit].name, "lora.head");
  EXPECT_EQ(l.units()[l.lm_head().unit].name, "head");
  const model::ParamUnit& u1 = l.units()[l.lora_unit(1)];
  EXPECT_EQ(u1.name, "lora.layer.1");
  ASSERT_EQ(u1.tensors.size(), 8u);  // A, B of q and down; input, post-attention, q, k norms
  EXPECT_EQ(u1.tensors[0].hf_name, "model.layers.1.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(u1.tensors[0].shape, (std::vector<int64_t>{3, 16}));
  EXPECT_EQ(u1.tensors[1].hf_name, "model.layers.1.self_attn.q_proj.lora_B.weight");
  EXPECT_EQ(u1.tensors[1].shape, (std::vector<int64_t>{16, 3}));
  EXPECT_EQ(u1.tensors[3].hf_name, "model.layers.1.mlp.down_proj.lora_B.weight");
  EXPECT_EQ(u1.tensors[2].shape, (std::vector<int64_t>{3, 10}));
  EXPECT_TRUE(u1.tensors[0].adapter && u1.tensors[0].lora_a && !u1.tensors[1].lora_a);
  EXPECT_EQ(u1.tensors[7].hf_name, "model.layers.1.self_attn.k_norm.weight");
  EXPECT_EQ(l.layer_tensor(1, model::kKNorm).unit, l.lora_unit(1));
  EXPECT_EQ(l.layer_tensor(1, model::kQ).unit, l.layer_unit(1));
  EXPECT_FALSE(l.lora_matrix(0, model::kLoraK, true).found());
  // A trainable copy names its base tensor.
  const model::ParamTensor& kn = u1.tensors[7];
  const model::ParamTensor& bkn =
      base.units()[static_cast<size_t>(kn.base_unit)].tensors[base.layer_slot(model::kKNorm)];
  EXPECT_EQ(kn.base_offset, bkn.offset);
  EXPECT_EQ(bkn.hf_name, kn.hf_name);
  EXPECT_EQ(l.total_numel(), base.total_numel() - cfg.vocab_size * 16 + l.trainable_numel());
  // PEFT's init: A in U(-1/sqrt(in), 1/sqrt(in)) and not constant, B zero; a copy the base's.
  std::vector<float> unit(static_cast<size_t>(u1.numel));
  model::init_random_range(l, l.lora_unit(1), 0, ops::Tensor(unit.data(), DType::F32, {u1.numel}), 0.02, 7);
  double lo = 1, hi = -1;
  for (int64_t i = 0; i < u1.tensors[0].numel; ++i)
    lo = std::min<double>(lo, unit[i]), hi = std::max<double>(hi, unit[i]);
  EXPECT_GE(lo, -0.25);
  EXPECT_LE(hi, 0.25);
  EXPECT_LT(lo, -0.1);
  EXPECT_GT(hi, 0.1);
  for (int64_t i = 0; i < u1.tensors[1].numel; ++i) EXPECT_EQ(unit[u1.tensors[1].offset + i], 0.0f);
  std::vector<float> emb(static_cast<size_t>(cfg.vocab_size * 16)), bemb(emb.size());
  model::init_random_range(l, l.embedding().unit, 0, ops::Tensor(emb.data(), DType::F32, {cfg.vocab_size * 16}), 0.02,
                           7);
  model::init_random_range(base, base.embed_unit(), 0, ops::Tensor(bemb.data(), DType::F32, {cfg.vocab_size * 16}),
                           0.02, 7);
  EXPECT_EQ(emb, bemb);
  // Tied embeddings: embed_tokens and lm_head are refused (PEFT would untie them).
  LoraCase t{"tied", "llama", true, {0}, true};
  EXPECT_THROW(model::ParamLayout(lora_config(t), spec_of(t)), InputError);
}

TEST(LoraSpec, ConfigValuesAndErrors) {
  StageConfig c;
  c.lora.rank = 8;
  c.lora.targets = " q_proj, v_proj ";
  c.lora.trainable = "embed_tokens,norm";
  const LoraSpec s = model::lora_spec(c.lora);
  EXPECT_TRUE(s.targets[model::kLoraQ] && s.targets[model::kLoraV] && !s.targets[model::kLoraK]);
  EXPECT_DOUBLE_EQ(s.scale(), 2.0);
  EXPECT_EQ(s.modules_to_save(), (std::vector<std::string>{"embed_tokens", "norm"}));
  c.lora.use_rslora = true;
  EXPECT_DOUBLE_EQ(model::lora_spec(c.lora).scale(), 16.0 / std::sqrt(8.0));
  auto refused = [](const std::string& yaml, const std::string& says) {
    try {
      parse_stage_config(yaml, "s.yaml");
      ADD_FAILURE() << "accepted: " << yaml;
    } catch (const InputError& e) { EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what(); }
  };
  refused("lora:\n  rank: 4\n  targets: q_proj,qproj\n", "lora.targets: unknown name 'qproj' (did you mean 'q_proj'?)");
  refused("lora:\n  rank: 4\n  targets: [q_proj, q_proj]\n", "'q_proj' is named twice");
  refused("lora:\n  rank: 4\n  trainable: [embeddings]\n", "lora.trainable: unknown name 'embeddings'");
  refused("lora:\n  rank: 4\n  targets: \"\"\n", "lora.targets: empty with lora.rank 4");
  refused("lora:\n  rank: 4\n  dropout: 0.1\n", "lora.dropout: 0.1: LoRA dropout is not implemented");
  refused("lora:\n  rank: -1\n", "lora.rank: bad value '-1'");
  refused("lora:\n  rank: 4\n  alpha: 0\n", "lora.alpha: bad value '0'");
  const StageConfig ok = parse_stage_config("lora:\n  rank: 16\n  targets: [q_proj, k_proj]\n", "s.yaml");
  EXPECT_EQ(ok.lora.targets, "q_proj,k_proj");
  EXPECT_NE(dump_stage_config(ok).find("targets: \"q_proj,k_proj\""), std::string::npos);
}

}  // namespace
}  // namespace easyctx::test
