// safetensors import/export: round trips (single, sharded, BF16), and every kind of bad
// file gives a clear InputError naming the problem.
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <random>

#include "ckpt/hf_model.h"
#include "ckpt/safetensors.h"
#include "core/strings.h"
#include "model/llama.h"
#include "../train/train_test_util.h"

namespace easyctx::test {
namespace {

using ops::DType;

struct HfFolder : ::testing::Test {
  TempDir dir{"st"};
  model::LlamaConfig cfg = model::load_llama_config("tiny");
  model::ParamLayout layout{cfg};
  std::unique_ptr<ops::Backend> be = ops::make_cpu_backend();
  std::vector<ops::Buffer> bufs;
  std::vector<ops::Tensor> units;

  void SetUp() override {
    for (const auto& u : layout.units()) {
      bufs.push_back(be->alloc(DType::F32, u.numel));
      units.push_back(bufs.back().flat());
    }
    model::init_random(layout, units, 0.5, test_seed());
  }
  std::vector<ops::Tensor> fresh() {
    std::vector<ops::Tensor> v;
    for (const auto& u : layout.units()) {
      bufs.push_back(be->alloc(DType::F32, u.numel));
      v.push_back(bufs.back().flat());
    }
    return v;
  }
  static std::vector<float> flat(const std::vector<ops::Tensor>& us) {
    std::vector<float> w;
    for (const auto& u : us) w.insert(w.end(), u.ptr<float>(), u.ptr<float>() + u.numel());
    return w;
  }
  // Expects load_hf_weights(path) to throw InputError whose text contains every needle.
  void expect_error(const std::string& path, const std::vector<std::string>& needles) {
    auto dst = fresh();
    try {
      ckpt::load_hf_weights(path, layout, dst);
      ADD_FAILURE() << "no error for " << path;
    } catch (const InputError& e) {
      for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  }
  std::string bytes_of(const std::string& p) { return read_file(p); }
  void put(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }
};

TEST_F(HfFolder, RoundTripF32SingleAndSharded) {
  ckpt::save_hf_model(dir / "one", cfg, layout, units);
  EXPECT_TRUE(std::filesystem::exists(dir / "one/model.safetensors"));
  auto a = fresh();
  ckpt::load_hf_weights(dir / "one", layout, a);
  EXPECT_EQ(flat(a), flat(units));
  ckpt::save_hf_model(dir / "many", cfg, layout, units, ckpt::StDType::F32, 100000);
  EXPECT_TRUE(std::filesystem::exists(dir / "many/model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(dir / "many/model.safetensors"));
  auto b = fresh();
  ckpt::load_hf_weights(dir / "many", layout, b);
  EXPECT_EQ(flat(b), flat(units));
  EXPECT_EQ(model::load_llama_config(dir / "many").num_parameters(), cfg.num_parameters());
}

// Range reads: any [first, first + count) of a tensor, F32 / BF16 / F16 / F64 on disk, equals
// that slice of the whole read, and reads only its bytes; a tensor past the reader's chunk
// (SafetensorsReader::kReadChunkBytes) reads across the chunk boundaries. HfUnitReader reads any
// range of a unit (spanning tensors, in a sharded folder) as load_hf_weights has it.
TEST_F(HfFolder, RangeReadsReadOnlyTheirBytes) {
  std::mt19937_64 rng(test_seed());
  const int64_t big =
      static_cast<int64_t>(ckpt::SafetensorsReader::kReadChunkBytes / 4) * 5 / 4 + 37;  // > 1 chunk of f32
  std::vector<double> values(static_cast<size_t>(big));
  std::normal_distribution<double> nd;
  for (double& v : values) v = nd(rng);
  std::vector<ckpt::StWriteTensor> ts;
  for (ckpt::StDType t : {ckpt::StDType::F32, ckpt::StDType::BF16, ckpt::StDType::F16, ckpt::StDType::F64})
    ts.push_back({std::string("w.") + ckpt::st_dtype_name(t), {big}, values.data(), DType::F64, t});
  ckpt::write_safetensors(dir / "r.safetensors", ts);
  const ckpt::SafetensorsReader r(dir / "r.safetensors");
  for (const ckpt::StWriteTensor& w : ts) {
    const ckpt::StTensor& t = *r.find(w.name);
    std::vector<float> whole(static_cast<size_t>(big));
    r.read(t, DType::F32, whole.data());
    if (t.dtype == ckpt::StDType::F32 || t.dtype == ckpt::StDType::F64) {  // (the whole read against what was written)
      for (int64_t i = 0; i < big; i += 997)
        ASSERT_EQ(whole[static_cast<size_t>(i)], static_cast<float>(values[static_cast<size_t>(i)]));
    }
    for (int trial = 0; trial < 4; ++trial) {
      const int64_t first = trial == 0 ? 0 : static_cast<int64_t>(rng() % static_cast<uint64_t>(big));
      const int64_t count = trial == 0 ? big : static_cast<int64_t>(rng() % static_cast<uint64_t>(big - first + 1));
      std::vector<float> part(static_cast<size_t>(count));
      const uint64_t before = r.bytes_read();
      r.read_range(t, first, count, DType::F32, part.data());
      EXPECT_EQ(r.bytes_read() - before, static_cast<uint64_t>(count) * ckpt::st_dtype_size(t.dtype)) << w.name;
      EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + first))
          << w.name << " [" << first << ", +" << count << ")";
    }
  }
  // A unit's ranges through HfUnitReader, in a folder of several files.
  ckpt::save_hf_model(dir / "many", cfg, layout, units, ckpt::StDType::F32, 60000);
  ckpt::HfUnitReader hf(dir / "many", layout);
  for (size_t u = 0; u < layout.num_units(); ++u) {
    const int64_t n = layout.units()[u].numel;
    const int64_t lo = static_cast<int64_t>(rng() % static_cast<uint64_t>(n)),
                  len = static_cast<int64_t>(rng() % static_cast<uint64_t>(n - lo + 1));
    std::vector<float> part(static_cast<size_t>(len));
    const uint64_t before = hf.bytes_read();
    hf.read(u, lo, len, part.data());
    EXPECT_EQ(hf.bytes_read() - before, static_cast<uint64_t>(4 * len));
    EXPECT_TRUE(std::equal(part.begin(), part.end(), units[u].ptr<float>() + lo)) << layout.units()[u].name;
  }
  EXPECT_NO_THROW(hf.check_finite());
}

TEST_F(HfFolder, RoundTripBf16WithinRounding) {
  ckpt::save_hf_model(dir / "bf", cfg, layout, units, ckpt::StDType::BF16);
  auto a = fresh();
  ckpt::load_hf_weights(dir / "bf", layout, a);
  EXPECT_LT(rel_error(flat(a), flat(units)), 4e-3);
  EXPECT_GT(rel_error(flat(a), flat(units)), 0.0);
}

TEST_F(HfFolder, BadHeaderLength) {
  ckpt::save_hf_model(dir / "m", cfg, layout, units);
  std::string s = bytes_of(dir / "m/model.safetensors");
  std::string huge = s;
  for (int i = 0; i < 8; ++i) huge[static_cast<size_t>(i)] = i < 6 ? '\xff' : '\0';
  put(dir / "m/model.safetensors", huge);
  expect_error(dir / "m", {"header length", "model.safetensors"});
  put(dir / "m/model.safetensors", s.substr(0, 5));
  expect_error(dir / "m", {"truncated"});
}

TEST_F(HfFolder, TruncatedDataOffsetsPastTheEnd) {
  ckpt::save_hf_model(dir / "m", cfg, layout, units);
  std::string s = bytes_of(dir / "m/model.safetensors");
  put(dir / "m/model.safetensors", s.substr(0, s.size() - 100));
  expect_error(dir / "m", {"past the end", "lm_head.weight"});
}

TEST_F(HfFolder, OverlappingOffsets) {
  std::vector<float> a(4, 1.0f);
  ckpt::write_safetensors(dir / "x.safetensors", {{"a", {4}, a.data(), DType::F32, ckpt::StDType::F32},
                                                  {"b", {4}, a.data(), DType::F32, ckpt::StDType::F32}});
  std::string s = bytes_of(dir / "x.safetensors");
  const size_t p = s.find("[16,32]");
  ASSERT_NE(p, std::string::npos);
  s.replace(p, 7, "[8,24] ");
  put(dir / "x.safetensors", s);
  try {
    ckpt::SafetensorsReader r(dir / "x.safetensors");
    FAIL();
  } catch (const InputError& e) { EXPECT_NE(std::string(e.what()).find("overlap"), std::string::npos) << e.what(); }
}

TEST_F(HfFolder, WrongShapeMissingUnexpectedAndDtypeInOneMessage) {
  std::vector<ckpt::StWriteTensor> ts;
  for (size_t u = 0; u < layout.num_units(); ++u)
    for (const auto& t : layout.units()[u].tensors) {
      if (t.hf_name == "model.layers.1.mlp.up_proj.weight") continue;  // missing
      ckpt::StWriteTensor w{t.hf_name, t.shape, units[u].ptr<float>() + t.offset, DType::F32, ckpt::StDType::F32};
      if (t.hf_name == "model.layers.0.self_attn.k_proj.weight") std::swap(w.shape[0], w.shape[1]);  // wrong shape
      ts.push_back(w);
    }
  std::vector<float> extra(3, 0.5f);
  ts.push_back({"model.layers.9.mlp.gate_proj.weight", {3}, extra.data(), DType::F32, ckpt::StDType::F32});
  std::filesystem::create_directories(dir / "bad");
  ckpt::write_safetensors(dir / "bad/model.safetensors", ts);
  expect_error(dir / "bad", {"missing: model.layers.1.mlp.up_proj.weight",
                             "model.layers.0.self_attn.k_proj.weight has shape [64, 32]",
                             "unexpected: model.layers.9.mlp.gate_proj.weight"});
  // A weight stored as I32.
  std::string s = bytes_of(dir / "bad/model.safetensors");
  const size_t p = s.find("\"F32\"");
  s.replace(p, 5, "\"I32\"");
  put(dir / "bad/model.safetensors", s);
  expect_error(dir / "bad", {"dtype I32"});
}

TEST_F(HfFolder, ShardIndexMustMatchTheShards) {
  ckpt::save_hf_model(dir / "many", cfg, layout, units, ckpt::StDType::F32, 100000);
  std::string idx = bytes_of(dir / "many/model.safetensors.index.json");
  const size_t p = idx.find("\"lm_head.weight\"");
  ASSERT_NE(p, std::string::npos);
  idx.replace(p, 16, "\"lm_head.weight2\"");
  put(dir / "many/model.safetensors.index.json", idx);
  auto dst = fresh();
  try {
    ckpt::load_hf_weights(dir / "many", layout, dst);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("lm_head.weight2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace easyctx::test
