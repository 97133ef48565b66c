// easyctx_convert: HF -> ckpt -> HF is exact in f32 and bf16; a trainer checkpoint exports
// with the stage's rope_theta and context in config.json; bad arguments are named.
#include <gtest/gtest.h>

#include <filesystem>

#include "ckpt/convert.h"
#include "ckpt/hf_model.h"
#include "core/error.h"
#include "core/json.h"
#include "core/strings.h"
#include "model/llama.h"
#include "ops/half.h"
#include "test_util.h"

using namespace easyctx;
namespace fs = std::filesystem;

namespace {
std::string tmpdir(const std::string& tag) {
  std::string d = fs::temp_directory_path().string() + "/easyctx-convert-" + tag + "-" +
                  std::to_string(test::test_seed() % 1000003);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}
struct Units {
  std::vector<std::vector<float>> data;
  std::vector<ops::Tensor> views() {
    std::vector<ops::Tensor> v;
    for (auto& u : data)
      v.emplace_back(u.data(), ops::DType::F32, std::initializer_list<int64_t>{static_cast<int64_t>(u.size())});
    return v;
  }
};
Units alloc_units(const model::ParamLayout& layout) {
  Units u;
  for (const auto& unit : layout.units()) u.data.emplace_back(static_cast<size_t>(unit.numel), -1.0f);
  return u;
}
}  // namespace

TEST(Convert, HfCkptHfRoundTripIsExact) {
  const std::string dir = tmpdir("rt");
  model::LlamaConfig cfg = model::load_llama_config("tiny");
  cfg.rope_theta = 123456.0;
  const model::ParamLayout layout(cfg);
  Units w = alloc_units(layout);
  model::init_random(layout, w.views(), 0.5, test::test_seed());
  for (ckpt::StDType dt : {ckpt::StDType::F32, ckpt::StDType::BF16}) {
    const std::string tag = dt == ckpt::StDType::F32 ? "f32" : "bf16";
    if (dt == ckpt::StDType::BF16)  // what a bf16 file can hold
      for (auto& u : w.data)
        for (auto& x : u) x = ops::bf16_to_float(ops::float_to_bf16(x));
    ckpt::save_hf_model(dir + "/hf-" + tag, cfg, layout, w.views(), dt);
    ckpt::ConvertOptions a;
    a.from = "hf:" + dir + "/hf-" + tag;
    a.to = "ckpt:" + dir + "/ck-" + tag;
    ckpt::convert_model(a);
    ckpt::ConvertOptions b;
    b.from = "ckpt:" + dir + "/ck-" + tag;
    b.to = "hf:" + dir + "/back-" + tag;
    b.dtype = dt;
    ckpt::convert_model(b);
    Units back = alloc_units(layout);
    ckpt::load_hf_weights(dir + "/back-" + tag, layout, back.views());
    for (size_t u = 0; u < w.data.size(); ++u) ASSERT_EQ(back.data[u], w.data[u]) << tag << " unit " << u;
    Json c = parse_json(read_file(dir + "/back-" + tag + "/config.json"));
    EXPECT_DOUBLE_EQ(c.at("rope_theta").as_double(), 123456.0) << c.dump();
  }
  fs::remove_all(dir);
}

TEST(Convert, ShardsAboveTheLimitWithAnIndex) {
  const std::string dir = tmpdir("shard");
  model::LlamaConfig cfg = model::load_llama_config("tiny");
  const model::ParamLayout layout(cfg);
  Units w = alloc_units(layout);
  model::init_random(layout, w.views(), 0.5, test::test_seed());
  ckpt::save_hf_model(dir + "/hf", cfg, layout, w.views(), ckpt::StDType::F32);
  ckpt::ConvertOptions o;
  o.from = "hf:" + dir + "/hf";
  o.to = "hf:" + dir + "/sharded";
  o.dtype = ckpt::StDType::F32;
  o.max_shard_bytes = 40000;  // the tiny model is ~0.2 MB: several shards
  o.max_position_embeddings = 65536;
  ckpt::convert_model(o);
  EXPECT_TRUE(fs::exists(dir + "/sharded/model.safetensors.index.json"));
  Units back = alloc_units(layout);
  ckpt::load_hf_weights(dir + "/sharded", layout, back.views());
  for (size_t u = 0; u < w.data.size(); ++u) ASSERT_EQ(back.data[u], w.data[u]);
  Json c = parse_json(read_file(dir + "/sharded/config.json"));
  EXPECT_EQ(c.at("max_position_embeddings").as_int(), 65536);
  fs::remove_all(dir);
}

TEST(Convert, BadArgumentsAreNamed) {
  auto msg = [](const std::string& from, const std::string& to) {
    ckpt::ConvertOptions o;
    o.from = from;
    o.to = to;
    try {
      ckpt::convert_model(o);
    } catch (const InputError& e) { return std::string(e.what()); }
    return std::string();
  };
  EXPECT_NE(msg("gs://x", "hf:/tmp/y").find("--from gs://x: expected ckpt:DIR or hf:DIR"), std::string::npos);
  EXPECT_NE(msg("hf:/tmp/y", "zip:/tmp/z").find("--to zip:/tmp/z"), std::string::npos);
  EXPECT_NE(msg("ckpt:/nonexistent/run", "hf:/tmp/y").find("no committed checkpoint"), std::string::npos);
  EXPECT_NE(msg("hf:/nonexistent/model", "ckpt:/tmp/y").find("/nonexistent/model"), std::string::npos);
}
