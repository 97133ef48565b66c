// Strict weight import: NaN/Inf (and F64 values beyond f32) are refused naming the tensor,
// its file and the index of the first bad value; safetensors shapes are overflow-checked;
// the perplexity sweep never returns a non-finite row for a scored length.
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>

#include "ckpt/hf_model.h"
#include "ckpt/safetensors.h"
#include "core/strings.h"
#include "eval/perplexity.h"
#include "model/llama.h"
#include "ops/half.h"
#include "../train/train_test_util.h"

using easyctx::test::input_error_of;

namespace easyctx::test {
namespace {

using ops::DType;

struct Weights {
  model::LlamaConfig cfg = model::load_llama_config("tiny");
  model::ParamLayout layout{cfg};
  std::unique_ptr<ops::Backend> be = ops::make_cpu_backend();
  std::vector<ops::Buffer> bufs;
  std::vector<ops::Tensor> units;
  explicit Weights(uint64_t seed, double std = 0.5) { units = fresh(), model::init_random(layout, units, std, seed); }
  std::vector<ops::Tensor> fresh(DType t = DType::F32) {
    std::vector<ops::Tensor> v;
    for (const auto& u : layout.units()) {
      bufs.push_back(be->alloc(t, u.numel));
      v.push_back(bufs.back().flat());
    }
    return v;
  }
  // A random tensor of the layout and a random element of it.
  struct Pick {
    size_t unit;
    const model::ParamTensor* t;
    int64_t flat;
  };
  Pick pick(std::mt19937_64& rng) const {
    const size_t u = rng() % layout.num_units();
    const auto& ts = layout.units()[u].tensors;
    const model::ParamTensor& t = ts[rng() % ts.size()];
    return {u, &t, static_cast<int64_t>(rng() % static_cast<uint64_t>(t.numel))};
  }
  float& at(const Pick& p) { return units[p.unit].ptr<float>()[p.t->offset + p.flat]; }
};

std::string index_of(const model::ParamTensor& t, int64_t flat) {
  if (t.shape.size() == 1) return "[" + std::to_string(flat) + "]";
  return "[" + std::to_string(flat / t.shape[1]) + ", " + std::to_string(flat % t.shape[1]) + "]";
}

// Fresh random tensors and positions, NaN, +Inf and -Inf, stored F32 and BF16: the error
// names the tensor, the file, the value and its index; a folder with two bad tensors names both.
TEST(ImportStrict, NonFiniteWeightsAreRefusedByName) {
  std::mt19937_64 rng(test_seed());
  TempDir dir("import-nan");
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
  int cases = 0;
  for (int trial = 0; trial < 6; ++trial) {
    Weights w(rng());
    const Weights::Pick p = w.pick(rng);
    const float v = bad_values[trial % 3];
    w.at(p) = v;
    const ckpt::StDType dt = trial < 3 ? ckpt::StDType::F32 : ckpt::StDType::BF16;
    const std::string out = dir / ("m" + std::to_string(trial));
    ckpt::save_hf_model(out, w.cfg, w.layout, w.units, dt);
    auto dst = w.fresh();
    const std::string e = input_error_of([&] { ckpt::load_hf_weights(out, w.layout, dst); });
    EXPECT_NE(
        e.find("tensor '" + p.t->hf_name + "' (" + out + "/model.safetensors, " + ckpt::st_dtype_name(dt) + ") holds "),
        std::string::npos)
        << e;
    EXPECT_NE(e.find(" at index " + index_of(*p.t, p.flat) + " (the first of 1 non-finite value)"), std::string::npos)
        << e;
    EXPECT_NE(e.find(std::isnan(v) ? "nan" : "inf"), std::string::npos) << e;
    ++cases;
  }
  // Two bad tensors, a sharded folder: both named.
  Weights w(rng());
  Weights::Pick a = w.pick(rng), b = w.pick(rng);
  while (b.t == a.t) b = w.pick(rng);
  w.at(a) = std::numeric_limits<float>::quiet_NaN();
  w.at(b) = std::numeric_limits<float>::infinity();
  ckpt::save_hf_model(dir / "two", w.cfg, w.layout, w.units, ckpt::StDType::F32, 60000);
  auto dst = w.fresh();
  const std::string e = input_error_of([&] { ckpt::load_hf_weights(dir / "two", w.layout, dst); });
  EXPECT_NE(e.find("2 tensors hold non-finite weights"), std::string::npos) << e;
  EXPECT_NE(e.find(a.t->hf_name), std::string::npos) << e;
  EXPECT_NE(e.find(b.t->hf_name), std::string::npos) << e;
  EXPECT_GE(cases + 1, 7);
}

// An F64 value beyond the f32 range becomes inf when loaded as f32 (refused, saying so) but
// loads into f64.
TEST(ImportStrict, F64BeyondF32IsRefusedForF32Only) {
  std::mt19937_64 rng(test_seed());
  TempDir dir("import-f64");
  Weights w(rng());
  auto d64 = w.fresh(DType::F64);
  for (size_t u = 0; u < w.units.size(); ++u)
    for (int64_t i = 0; i < w.units[u].numel(); ++i) d64[u].ptr<double>()[i] = w.units[u].ptr<float>()[i];
  const Weights::Pick p = w.pick(rng);
  d64[p.unit].ptr<double>()[p.t->offset + p.flat] = 1e300;
  ckpt::save_hf_model(dir / "m", w.cfg, w.layout, d64, ckpt::StDType::F32);  // stored F32: inf already
  std::vector<ckpt::StWriteTensor> ts;
  for (size_t u = 0; u < w.layout.num_units(); ++u)
    for (const auto& t : w.layout.units()[u].tensors)
      ts.push_back({t.hf_name, t.shape, d64[u].ptr<double>() + t.offset, DType::F64, ckpt::StDType::F64});
  ckpt::write_safetensors(dir / "m/model.safetensors", ts);
  auto f32 = w.fresh();
  const std::string e = input_error_of([&] { ckpt::load_hf_weights(dir / "m", w.layout, f32); });
  EXPECT_NE(e.find("tensor '" + p.t->hf_name + "'"), std::string::npos) << e;
  EXPECT_NE(e.find("F64 value beyond the f32 range"), std::string::npos) << e;
  auto f64 = w.fresh(DType::F64);
  EXPECT_NO_THROW(ckpt::load_hf_weights(dir / "m", w.layout, f64));
  EXPECT_EQ(f64[p.unit].ptr<double>()[p.t->offset + p.flat], 1e300);
}

// A header whose shape product overflows is refused naming the tensor, before any size is
// derived from it (it could otherwise wrap to match the stored byte count).
TEST(ImportStrict, SafetensorsShapeProductsAreChecked) {
  std::mt19937_64 rng(test_seed());
  TempDir dir("import-shape");
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t a = (int64_t{1} << 32) + static_cast<int64_t>(rng() % 1000);
    const int64_t b = (int64_t{1} << 31) + static_cast<int64_t>(rng() % 1000);
    const std::string header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(a) + "," + std::to_string(b) +
                               "],\"data_offsets\":[0,4]}}";
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i) file[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    file += header + std::string(4, '\0');
    std::ofstream(dir / "x.safetensors", std::ios::binary) << file;
    const std::string e = input_error_of([&] { ckpt::SafetensorsReader r(dir / "x.safetensors"); });
    EXPECT_NE(e.find(dir / "x.safetensors: tensor 'w': shape"), std::string::npos) << e;
    EXPECT_NE(e.find(std::to_string(a) + " x " + std::to_string(b)), std::string::npos) << e;
  }
}

// Weights that are finite but overflow the forward pass: the sweep stops with an error naming
// the document, its file and the length instead of returning a nan row; a length no document
// reaches is refused up front when asked (easyctx_eval_ppl asks).
TEST(ImportStrict, PerplexityNeverReturnsANonFiniteScoredRow) {
  std::mt19937_64 rng(test_seed());
  TempDir dir("ppl-strict");
  write_walk_shard(dir / "shard.h5", rng(), 6, 12, 30, 256);
  Weights w(rng(), 1e18);  // finite weights whose activations overflow f32
  ckpt::save_hf_model(dir / "model", w.cfg, w.layout, w.units);
  eval::PplOptions o;
  o.model_dir = dir / "model";
  o.tokenized = {dir / "shard.h5"};
  o.min_tokens = 4;
  o.max_tokens = 12;
  o.tokens_step = 4;
  std::string e = input_error_of([&] { eval::evaluate_perplexity(o, nullptr); });
  EXPECT_NE(e.find("the model's loss is not finite"), std::string::npos) << e;
  EXPECT_NE(e.find("on document 0 of " + (dir / "shard.h5") + " at length "), std::string::npos) << e;
  o.max_tokens = 10000;
  o.tokens_step = 9996;
  o.require_every_length = true;
  e = input_error_of([&] { eval::evaluate_perplexity(o, nullptr); });
  EXPECT_NE(e.find("--max-tokens: no document of " + (dir / "shard.h5") + " has 10000 tokens (the longest has "),
            std::string::npos)
      << e;
  o.max_tokens = int64_t{1} << 40;
  e = input_error_of([&] { eval::evaluate_perplexity(o, nullptr); });
  EXPECT_NE(e.find("--max-tokens: 1099511627776 is above 1073741824"), std::string::npos) << e;
  o.max_tokens = 1 << 30;
  o.tokens_step = 1;
  e = input_error_of([&] { eval::evaluate_perplexity(o, nullptr); });
  EXPECT_NE(e.find("--tokens-step: 1 gives 1073741821 lengths"), std::string::npos) << e;
}

}  // namespace
}  // namespace easyctx::test
