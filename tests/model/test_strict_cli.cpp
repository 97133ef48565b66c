// Strict inputs through the programs, as the issue found them: an absurd model size is
// refused by --plan naming the key (it planned as "fits"); a folder given as the stage YAML
// is named; NaN weights are refused by easyctx_train (model.init hf:DIR), easyctx_convert
// and easyctx_eval_ppl naming the tensor, exit 2 and nothing written; easyctx_eval_ppl never
// writes a nan row; model.init hf:DIR takes the model's shape from DIR/config.json.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "ckpt/hf_model.h"
#include "core/strings.h"
#include "model/llama.h"
#include "../train/train_test_util.h"

namespace easyctx::test {
namespace {

namespace fs = std::filesystem;

std::string bin(const char* name) { return bin_dir() + "/" + name; }

#define REQUIRE_PROGRAMS()                                                       \
  for (const char* p : {"easyctx_train", "easyctx_convert", "easyctx_eval_ppl"}) \
    if (!fs::exists(bin(p))) GTEST_FAIL() << bin(p) << " is not built (the test depends on it)";

void write(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  ASSERT_TRUE(f.good()) << path;
}

TEST(StrictCli, AbsurdModelSizesAndFolderStage) {
  REQUIRE_PROGRAMS();
  TempDir dir("cli-sizes");
  const std::string demo = source_dir() + "/configs/demo.yaml";
  const std::string base =
      "hidden_size: 64\nnum_hidden_layers: 2\nnum_attention_heads: 4\nnum_key_value_heads: 2\n"
      "vocab_size: 256\n";
  write(dir / "big_i.yaml", base + "head_dim: 16\nintermediate_size: 144115188075855872\n");
  write(dir / "big_hd.yaml", base + "head_dim: 4611686018427387904\nintermediate_size: 172\n");
  std::string out;
  EXPECT_EQ(run_shell(bin("easyctx_train") + " " + demo + " --set model.config=" + dir / "big_i.yaml" + " --plan", out),
            2);
  EXPECT_NE(out.find(dir / "big_i.yaml: intermediate_size = 144115188075855872 is above the limit"), std::string::npos)
      << out;
  EXPECT_EQ(
      run_shell(bin("easyctx_train") + " " + demo + " --set model.config=" + dir / "big_hd.yaml" + " --plan", out), 2);
  EXPECT_NE(out.find(dir / "big_hd.yaml: head_dim = 4611686018427387904 is above the limit"), std::string::npos) << out;
  EXPECT_EQ(out.find("max_size"), std::string::npos) << out;
  EXPECT_EQ(run_shell(bin("easyctx_train") + " " + dir.path() + " --print-config", out), 2);
  EXPECT_NE(out.find(dir.path() + ": is a folder; the stage config is one YAML file (this folder holds big_hd.yaml"),
            std::string::npos)
      << out;
}

struct NanModel {
  TempDir dir{"cli-nan"};
  std::string bad_tensor;
  NanModel() {
    std::mt19937_64 rng(test_seed());
    write_walk_shard(dir / "shard.h5", rng(), 30, 20, 60, 256);
    model::LlamaConfig cfg = model::load_llama_config("tiny");
    cfg.num_layers = 3;  // not tiny's shape: the folder's config.json must give it
    model::ParamLayout layout(cfg);
    auto be = ops::make_cpu_backend();
    std::vector<ops::Buffer> bufs;
    std::vector<ops::Tensor> units;
    for (const auto& u : layout.units()) {
      bufs.push_back(be->alloc(ops::DType::F32, u.numel));
      units.push_back(bufs.back().flat());
    }
    model::init_random(layout, units, 0.1, rng());
    ckpt::save_hf_model(dir / "good", cfg, layout, units);
    const size_t u = 1 + rng() % static_cast<size_t>(cfg.num_layers);
    const model::ParamTensor& t = layout.units()[u].tensors[rng() % layout.units()[u].tensors.size()];
    units[u].ptr<float>()[t.offset + static_cast<int64_t>(rng() % static_cast<uint64_t>(t.numel))] =
        std::numeric_limits<float>::quiet_NaN();
    bad_tensor = t.hf_name;
    ckpt::save_hf_model(dir / "nan", cfg, layout, units);
  }
  std::string stage(const std::string& init, const std::string& extra = "") {
    const std::string path = dir / ("stage-" + std::to_string(++n) + ".yaml");
    write(path, "model: {init: \"" + init + "\"" + extra + "}\ndata: {path: " + dir / "shard.h5" +
                    ", seq_length: 16}\ntrain: {device: cpu, steps: 2}\noutput: {dir: " +
                    dir / ("run" + std::to_string(n)) + "}\n");
    return path;
  }
  int n = 0;
};

TEST(StrictCli, NanWeightsAreRefusedEverywhere) {
  REQUIRE_PROGRAMS();
  NanModel m;
  std::string out;
  EXPECT_EQ(run_shell(bin("easyctx_train") + " " + m.stage("hf:" + m.dir / "nan"), out), 2) << out;
  EXPECT_NE(out.find("tensor '" + m.bad_tensor + "'"), std::string::npos) << out;
  EXPECT_NE(out.find("non-finite"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(m.dir / "run1/final")) << out;
  EXPECT_EQ(run_shell(bin("easyctx_convert") + " --from hf:" + m.dir / "nan" + " --to ckpt:" + m.dir / "ck", out), 2)
      << out;
  EXPECT_NE(out.find("tensor '" + m.bad_tensor + "'"), std::string::npos) << out;
  EXPECT_EQ(run_shell(bin("easyctx_eval_ppl") + " --model " + m.dir / "nan" + " --tokenized " + m.dir / "shard.h5" +
                          " --min-tokens 4 --max-tokens 16 --tokens-step 4 --output-file " + m.dir / "ppl.csv",
                      out),
            2)
      << out;
  EXPECT_NE(out.find("tensor '" + m.bad_tensor + "'"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(m.dir / "ppl.csv"));
  // A length no document reaches: an error, never a nan row.
  EXPECT_EQ(run_shell(bin("easyctx_eval_ppl") + " --model " + m.dir / "good" + " --tokenized " + m.dir / "shard.h5" +
                          " --min-tokens 4 --max-tokens 64 --tokens-step 30 --output-file " + m.dir / "ppl.csv",
                      out),
            2)
      << out;
  EXPECT_NE(out.find("--max-tokens: no document of " + m.dir / "shard.h5" + " has 64 tokens"), std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(m.dir / "ppl.csv"));
  ASSERT_EQ(run_shell(bin("easyctx_eval_ppl") + " --model " + m.dir / "good" + " --tokenized " + m.dir / "shard.h5" +
                          " --min-tokens 4 --max-tokens 20 --tokens-step 8 --output-file " + m.dir / "ppl.csv",
                      out),
            0)
      << out;
  EXPECT_EQ(read_file(m.dir / "ppl.csv").find("nan"), std::string::npos) << read_file(m.dir / "ppl.csv");
}

TEST(StrictCli, HfInitTakesTheFoldersShape) {
  REQUIRE_PROGRAMS();
  NanModel m;
  std::string out;
  // model.config unset: the folder's 3-layer config.json, not the default preset.
  ASSERT_EQ(run_shell(bin("easyctx_train") + " " + m.stage("hf:" + m.dir / "good"), out), 0) << out;
  EXPECT_TRUE(fs::exists(m.dir / "run1/final/model.safetensors")) << out;
  EXPECT_NE(out.find("layers 3"), std::string::npos) << out;
  // model.config naming another model: both named, with what differs.
  EXPECT_EQ(run_shell(bin("easyctx_train") + " " + m.stage("hf:" + m.dir / "good", ", config: demo"), out), 2) << out;
  EXPECT_NE(out.find("model.config 'demo' and model.init hf:" + m.dir / "good" + " describe different models"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("num_hidden_layers 4 vs 3"), std::string::npos) << out;
  // model.config naming the same model (the folder itself): accepted.
  ASSERT_EQ(
      run_shell(bin("easyctx_train") + " " + m.stage("hf:" + m.dir / "good", ", config: \"" + m.dir / "good" + "\""),
                out),
      0)
      << out;
}

}  // namespace
}  // namespace easyctx::test
