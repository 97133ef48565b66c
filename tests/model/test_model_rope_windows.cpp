// Per-layer sliding windows in the model (CPU, fp64, fresh random weights):
//  - a window in some layers only (qwen2's use_sliding_window): the layers without it are full
//    attention, those with it windowed: every layer windowed equals Mistral's form (no layer
//    list) bit for bit, no layer windowed equals the model without a window bit for bit, and
//    the mixed model differs from both (the golden fixture qwen2_window checks it against
//    transformers).
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
std::vector<double> logits_of(model::LlamaModel& m, ops::Backend& be, const Params& p,
                              const std::vector<int32_t>& ids) {
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<int32_t> tok = ids, pos(ids.size()), lab(ids.size(), -1);
  for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  const model::Batch b{ops::Tensor(tok.data(), DType::I32, {n}), ops::Tensor(pos.data(), DType::I32, {n}),
                       ops::Tensor(lab.data(), DType::I32, {n}), 1, n};
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

}  // namespace
}  // namespace easyctx::test
