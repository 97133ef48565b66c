// Per-layer sliding windows and dynamic RoPE in the model (CPU, fp64, fresh random weights):
//  - a window in some layers only (qwen2's use_sliding_window): the layers without it are full
//    attention, those with it windowed: every layer windowed equals Mistral's form (no layer
//    list) bit for bit, no layer windowed equals the model without a window bit for bit, and
//    the mixed model differs from both (the golden fixture qwen2_window checks it against
//    transformers);
//  - dynamic RoPE: a call at or below max_position_embeddings gives the plain model's logits
//    bit for bit, a longer call others; each call uses its own length's frequencies whatever
//    came before (long, short, long again: each equal to a fresh model at that length);
//    Batch::rope_length (what the trainer and the evaluations give) wins over this rank's
//    positions.
#include <cmath>
#include <random>

#include "llama_test_util.h"
#include "model/llama.h"
#include "test_util.h"

namespace easyctx::test {
namespace {

using ops::DType;

model::LlamaConfig small(uint64_t seed) {
  std::mt19937_64 rng(seed);
  model::LlamaConfig c = llama_config("windows", {16, 3, 4, 2, 4, 24, 37});
  c.rope_theta = 50.0 + static_cast<double>(rng() % 100);
  c.max_position_embeddings = 64;
  return c;
}

struct Params {
  std::vector<ops::Buffer> bufs;
  std::vector<ops::Tensor> units;
};
Params random_params(ops::Backend& be, const model::ParamLayout& layout, uint64_t seed) {
  Params p;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 0.4);
  for (const auto& u : layout.units()) {
    p.bufs.push_back(be.alloc(DType::F64, u.numel));
    for (const auto& t : u.tensors)
      for (int64_t i = 0; i < t.numel; ++i)
        p.bufs.back().flat().ptr<double>()[t.offset + i] = (t.is_norm ? 1.0 : 0.0) + nd(rng);
    p.units.push_back(p.bufs.back().flat());
  }
  return p;
}

// Logits of one sequence of n tokens (positions 0..n-1) through `m`.
std::vector<double> logits_of(model::LlamaModel& m, ops::Backend& be, const Params& p, const std::vector<int32_t>& ids,
                              int64_t rope_length = 0) {
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<int32_t> tok = ids, pos(ids.size()), lab(ids.size(), -1);
  for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  model::Batch b{ops::Tensor(tok.data(), DType::I32, {n}), ops::Tensor(pos.data(), DType::I32, {n}),
                 ops::Tensor(lab.data(), DType::I32, {n}), 1, n};
  b.rope_length = rope_length;
  ops::Buffer l = be.alloc(DType::F64, n * m.config().vocab_size);
  m.forward_logits(p.units, b, l.flat());
  return std::vector<double>(l.flat().ptr<double>(), l.flat().ptr<double>() + l.numel());
}

std::vector<int32_t> random_ids(std::mt19937_64& rng, int64_t n, int64_t vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& x : ids) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return ids;
}

TEST(ModelWindows, PerLayerWindowsAreTheLayersOwn) {
  std::mt19937_64 rng(test_seed());
  auto be = ops::make_cpu_backend();
  model::LlamaConfig full = small(rng());
  const int64_t w = 2 + static_cast<int64_t>(rng() % 4);  // of 19 tokens
  model::LlamaConfig every = full, mixed = full, none = full;
  every.sliding_window = mixed.sliding_window = none.sliding_window = w;
  mixed.sliding_layers = {false, true, rng() % 2 == 0};
  none.sliding_layers = {false, false, false};
  model::LlamaConfig listed = every;
  listed.sliding_layers = {true, true, true};
  const Params p = random_params(*be, model::ParamLayout(full), rng());
  const std::vector<int32_t> ids = random_ids(rng, 19, full.vocab_size);
  auto run = [&](const model::LlamaConfig& c) {
    model::LlamaModel m(c, *be, DType::F64, {CheckpointPolicy::None, 5});
    return logits_of(m, *be, p, ids);
  };
  const std::vector<double> lf = run(full), le = run(every), lm = run(mixed);
  EXPECT_EQ(run(listed), le) << "a window in every listed layer is Mistral's form";
  EXPECT_EQ(run(none), lf) << "no windowed layer is the model without a window";
  EXPECT_GT(rel_error(lm, lf), 1e-6) << "the windowed layers changed nothing";
  EXPECT_GT(rel_error(lm, le), 1e-6) << "the full layers were windowed";
  EXPECT_EQ(mixed.windowed_layers(), 1 + (mixed.sliding_layers[2] ? 1 : 0));
}

TEST(ModelDynamicRope, EachCallUsesItsOwnLength) {
  std::mt19937_64 rng(test_seed());
  auto be = ops::make_cpu_backend();
  model::LlamaConfig plain = small(rng());
  model::LlamaConfig dyn = plain;
  dyn.rope_scaling.kind = model::RopeScalingKind::Dynamic;
  dyn.rope_scaling.factor = 1.5 + static_cast<double>(rng() % 4);
  dyn.max_position_embeddings = 16 + static_cast<int64_t>(rng() % 8);
  const Params p = random_params(*be, model::ParamLayout(plain), rng());
  const int64_t M = dyn.max_position_embeddings;
  const std::vector<int32_t> shorter = random_ids(rng, M - 3, plain.vocab_size),
                             at = random_ids(rng, M, plain.vocab_size),
                             longer = random_ids(rng, M + 9, plain.vocab_size);
  auto fresh = [&](const model::LlamaConfig& c, const std::vector<int32_t>& ids) {
    model::LlamaModel m(c, *be, DType::F64, {CheckpointPolicy::None, 5});
    return logits_of(m, *be, p, ids);
  };
  // Up to max_position_embeddings: the plain frequencies, bit for bit; past it, others.
  EXPECT_EQ(fresh(dyn, shorter), fresh(plain, shorter));
  EXPECT_EQ(fresh(dyn, at), fresh(plain, at));
  const std::vector<double> long_dyn = fresh(dyn, longer);
  EXPECT_GT(rel_error(long_dyn, fresh(plain, longer)), 1e-6);
  EXPECT_NE(dyn.inv_freq(M + 9), dyn.inv_freq(M));
  EXPECT_NE(dyn.inv_freq(M + 1), dyn.inv_freq(M));  // from the first length past M
  const std::vector<int32_t> just = random_ids(rng, M + 1, plain.vocab_size);
  EXPECT_GT(rel_error(fresh(dyn, just), fresh(plain, just)), 1e-9);
  EXPECT_EQ(dyn.inv_freq(M), plain.inv_freq());
  // One model through long, short, long: each call as a fresh model of that length.
  model::LlamaModel m(dyn, *be, DType::F64, {CheckpointPolicy::None, 5});
  EXPECT_EQ(logits_of(m, *be, p, longer), long_dyn);
  EXPECT_EQ(logits_of(m, *be, p, shorter), fresh(plain, shorter));
  EXPECT_EQ(logits_of(m, *be, p, longer), long_dyn);
  // The batch's length given (a sequence-parallel rank holds part of a longer sequence): the
  // frequencies of that length, not of this rank's positions.
  const std::vector<double> given = logits_of(m, *be, p, shorter, M + 9);
  EXPECT_GT(rel_error(given, fresh(plain, shorter)), 1e-6);
  model::LlamaModel m2(dyn, *be, DType::F64, {CheckpointPolicy::None, 5});
  EXPECT_EQ(logits_of(m2, *be, p, shorter, M + 9), given);
}

// transformers' _compute_dynamic_ntk_parameters for seq_len > max_position_embeddings, in
// double: base * (factor seq_len / max_pos - (factor - 1)) ^ (dim / (dim - 2)); easyctx computes
// it in torch's float32 steps, which stay within a few ulp of the double formula.
TEST(ModelDynamicRope, FrequenciesFollowTheFormula) {
  std::mt19937_64 rng(test_seed());
  for (int trial = 0; trial < 50; ++trial) {
    model::LlamaConfig c = llama_config("dyn", {64, 1, 4, 4, 16 * (1 + static_cast<int64_t>(rng() % 8)), 8, 8});
    c.rope_theta = 1000.0 * static_cast<double>(1 + rng() % 1000);
    c.rope_scaling.kind = model::RopeScalingKind::Dynamic;
    c.rope_scaling.factor = 1.0 + static_cast<double>(rng() % 64) / 8;
    c.max_position_embeddings = 256 << (rng() % 8);
    const int64_t len = c.max_position_embeddings + 1 +
                        (trial % 5 == 0 ? 0 : static_cast<int64_t>(rng() % (4 * c.max_position_embeddings)));
    const double dim = static_cast<double>(c.head_dim), f = c.rope_scaling.factor;
    const double base =
        c.rope_theta * std::pow(f * static_cast<double>(len) / static_cast<double>(c.max_position_embeddings) - (f - 1),
                                dim / (dim - 2));
    const std::vector<float> got = c.inv_freq(len);
    for (size_t i = 0; i < got.size(); ++i) {
      const double want = 1.0 / std::pow(base, static_cast<double>(2 * i) / dim);
      EXPECT_NEAR(got[i], want, 1e-5 * want) << "trial " << trial << " i " << i;
    }
    EXPECT_EQ(c.inv_freq(c.max_position_embeddings), c.inv_freq());
  }
}

}  // namespace
}  // namespace easyctx::test
