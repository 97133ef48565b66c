// The CPU model against Hugging Face transformers (float64 reference, fixtures written by
// tests/golden/make_golden.py): logits and loss to 1e-5 relative, every parameter gradient
// to 1e-4 relative norm error, RoPE frequencies exactly, for both activation policies and
// both compute dtypes. Fixture `gqa`: GQA, untied, default RoPE, offset positions in one
// row; `tied_llama3`: tied embeddings and llama3 rope scaling; `gqa_hd64`: head_dim 64
// (the CUDA model's bf16 golden check, tests/gpu/test_cuda_trainer.cpp). A fixture with
// doc_starts (make_golden.py's `packed`: 3-4 documents of odd lengths per sequence,
// position_ids restarting per document, HF's 4D block-diagonal causal mask) runs with
// Batch::documents (data.document_mask). qwen2 (q/k/v biases), qwen3 (q/k norms) and yarn
// (rope_type yarn and its attention factor) come from make_golden_families.py, as do mistral (a
// sliding window in every layer), qwen2_window (a window in its second layer only),
// dynamic_short and dynamic_long (dynamic RoPE below and past max_position_embeddings: the
// frequencies of the batch's length, transformers' after its forward), which
// bench/run_windows.sh makes on the GPU host: tested wherever they are in tests/golden/data.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "ckpt/convert.h"
#include "ckpt/hf_model.h"
#include "ckpt/lora_adapter.h"
#include "ckpt/safetensors.h"
#include "model/llama.h"
#include "test_util.h"

namespace easyctx::test {
namespace {

using ops::DType;

struct Golden {
  ckpt::SafetensorsReader io;
  explicit Golden(const std::string& dir) : io(dir + "/io.safetensors") {}
  std::vector<double> get(const std::string& name) const {
    const ckpt::StTensor* t = io.find(name);
    EXPECT_TRUE(t) << name;
    if (!t) return {};
    std::vector<double> v(static_cast<size_t>(t->numel()));
    io.read(*t, DType::F64, v.data());
    return v;
  }
  std::vector<int32_t> get_i32(const std::string& name) const {
    std::vector<int32_t> out;
    for (double x : get(name)) out.push_back(static_cast<int32_t>(std::lround(x)));
    return out;
  }
};

// The fixture's batch ([2, S] input_ids, position_ids and labels) as a model::Batch over
// its own vectors, and how many of its labels count (>= 0).
struct GoldenBatch {
  std::vector<int32_t> ids, pos, lab;
  int64_t B = 2, S = 0, labelled = 0;
  explicit GoldenBatch(const Golden& g)
      : ids(g.get_i32("input_ids")), pos(g.get_i32("position_ids")), lab(g.get_i32("labels")) {
    S = static_cast<int64_t>(ids.size()) / B;
    for (int32_t y : lab) labelled += y >= 0;
  }
  model::Batch batch() {
    return {ops::Tensor(ids.data(), DType::I32, {B * S}), ops::Tensor(pos.data(), DType::I32, {B * S}),
            ops::Tensor(lab.data(), DType::I32, {B * S}), B, S};
  }
};

// One buffer of `dtype` per unit of `layout` (kept in `bufs`), as flat tensors.
std::vector<ops::Tensor> alloc_units(ops::Backend& be, const model::ParamLayout& layout, DType dtype,
                                     std::vector<ops::Buffer>& bufs) {
  std::vector<ops::Tensor> out;
  for (const auto& u : layout.units()) {
    bufs.push_back(be.alloc(dtype, u.numel));
    out.push_back(bufs.back().flat());
  }
  return out;
}

// The fixture's documents (doc_starts, I64 [B, D]: each sequence's document starts, padded
// with -1), or none when the fixture has no doc_starts.
std::vector<attention::DocumentStarts> documents(const Golden& g, int64_t B) {
  std::vector<attention::DocumentStarts> docs;
  const ckpt::StTensor* t = g.io.find("doc_starts");
  if (!t) return docs;
  EXPECT_EQ(t->dtype, ckpt::StDType::I64);
  const std::vector<char> raw = g.io.read_raw(*t);
  const int64_t n = t->numel();
  docs.resize(static_cast<size_t>(B));
  for (int64_t i = 0; i < n; ++i) {
    int64_t x = 0;
    std::memcpy(&x, raw.data() + 8 * i, 8);
    if (x >= 0) docs[static_cast<size_t>(i / (n / B))].push_back(x);
  }
  return docs;
}

// The fixtures every checkout has, then those of make_golden_families.py that bench/run_windows.sh
// makes (tested where tests/golden/data has them; once committed they belong to the first list).
std::vector<std::string> fixtures(std::vector<std::string> names) {
  for (const char* f : {"mistral", "qwen2_window", "dynamic_short", "dynamic_long"})
    if (std::filesystem::exists(source_dir() + "/tests/golden/data/" + f + "/io.safetensors")) names.push_back(f);
  return names;
}

class GoldenTest : public ::testing::TestWithParam<std::tuple<std::string, CheckpointPolicy, DType>> {};

TEST_P(GoldenTest, MatchesTransformers) {
  const auto [name, policy, dtype] = GetParam();
  const std::string dir = source_dir() + "/tests/golden/data/" + name;
  const model::LlamaConfig cfg = model::load_llama_config(dir + "/model");
  Golden g(dir);
  auto be = ops::make_cpu_backend();
  model::LlamaModel m(cfg, *be, dtype, {policy, 7});  // lm_head tile 7: several tiles per batch

  GoldenBatch gb(g);
  const int64_t B = gb.B, S = gb.S;
  // RoPE frequencies: bit-exact with HF's fp32 inv_freq (dynamic: of the batch's length, the
  // largest position + 1, as the model computes them for this batch).
  const std::vector<double> hf_inv = g.get("inv_freq");
  const std::vector<float> inv = cfg.inv_freq(*std::max_element(gb.pos.begin(), gb.pos.end()) + 1);
  ASSERT_EQ(hf_inv.size(), inv.size());
  for (size_t i = 0; i < inv.size(); ++i) EXPECT_EQ(static_cast<double>(inv[i]), hf_inv[i]) << "inv_freq " << i;

  std::vector<ops::Buffer> bufs;
  const std::vector<ops::Tensor> params = alloc_units(*be, m.layout(), dtype, bufs);
  const std::vector<ops::Tensor> grads = alloc_units(*be, m.layout(), dtype, bufs);
  ckpt::load_hf_weights(dir + "/model", m.layout(), params);

  model::Batch b = gb.batch();
  const std::vector<attention::DocumentStarts> docs = documents(g, B);  // packed: the document mask
  if (!docs.empty()) b.documents = &docs;

  const double tol_logits = 1e-5;
  ops::Buffer logits = be->alloc(dtype, B * S * cfg.vocab_size);
  m.forward_logits(params, b, logits.flat());
  ops::Buffer l64 = be->alloc(DType::F64, logits.numel());
  be->copy(l64.flat(), logits.flat());
  const std::vector<double> want_logits = g.get("logits");
  EXPECT_LT(
      rel_error(std::vector<double>(l64.flat().ptr<double>(), l64.flat().ptr<double>() + l64.numel()), want_logits),
      tol_logits);

  const int64_t count = gb.labelled;
  const ops::LossSums ls = m.forward_backward(params, grads, b, 1.0 / static_cast<double>(count));
  EXPECT_EQ(ls.count, count);
  const double loss = ls.sum_nll / static_cast<double>(ls.count), want_loss = g.get("loss")[0];
  EXPECT_NEAR(loss, want_loss, std::abs(want_loss) * 1e-5);

  for (size_t u = 0; u < m.layout().num_units(); ++u)
    for (const model::ParamTensor& t : m.layout().units()[u].tensors) {
      const std::vector<double> want = g.get("grad." + t.hf_name);
      std::vector<double> got(static_cast<size_t>(t.numel));
      for (int64_t i = 0; i < t.numel; ++i)
        got[static_cast<size_t>(i)] =
            dtype == DType::F64 ? grads[u].ptr<double>()[t.offset + i] : grads[u].ptr<float>()[t.offset + i];
      EXPECT_LT(rel_error(got, want), 1e-4) << t.hf_name;
    }
}

INSTANTIATE_TEST_SUITE_P(All, GoldenTest,
                         ::testing::Combine(::testing::ValuesIn(fixtures({"gqa", "tied_llama3", "gqa_hd64", "packed",
                                                                          "qwen2", "qwen3", "yarn"})),
                                            ::testing::Values(CheckpointPolicy::None, CheckpointPolicy::Layer,
                                                              CheckpointPolicy::AttentionOutput),
                                            ::testing::Values(DType::F64, DType::F32)));

}  // namespace
}  // namespace easyctx::test

namespace easyctx::test {
namespace {

// Our export of a golden model reads back identically (weights and config). With
// EASYCTX_GOLDEN_EXPORT=DIR the exports are kept in DIR/<fixture> for check_export.py,
// which loads them with transformers and compares logits with the fixture.
TEST(GoldenExport, ExportReadsBackIdentically) {
  const char* keep = std::getenv("EASYCTX_GOLDEN_EXPORT");
  for (const std::string& name : fixtures({"gqa", "tied_llama3", "gqa_hd64", "qwen2", "qwen3", "yarn"})) {
    const std::string dir = source_dir() + "/tests/golden/data/" + name;
    const model::LlamaConfig cfg = model::load_llama_config(dir + "/model");
    const model::ParamLayout layout(cfg);
    auto be = ops::make_cpu_backend();
    std::vector<ops::Buffer> bufs;
    const std::vector<ops::Tensor> va = alloc_units(*be, layout, DType::F32, bufs);
    const std::vector<ops::Tensor> vb = alloc_units(*be, layout, DType::F32, bufs);
    ckpt::load_hf_weights(dir + "/model", layout, va);
    const std::string out = keep ? std::string(keep) + "/" + name
                                 : "/tmp/easyctx-golden-export-" + std::to_string(test_seed() % 1000000) + "-" + name;
    ckpt::save_hf_model(out, cfg, layout, va);
    const model::LlamaConfig back = model::load_llama_config(out);
    EXPECT_EQ(back.inv_freq(), cfg.inv_freq());
    EXPECT_EQ(back.inv_freq(int64_t{1} << 20), cfg.inv_freq(int64_t{1} << 20));  // dynamic: the rescaled ones too
    for (int64_t l = 0; l < cfg.num_layers; ++l) EXPECT_EQ(back.window_of(l), cfg.window_of(l)) << "layer " << l;
    EXPECT_EQ(back.tie_word_embeddings, cfg.tie_word_embeddings);
    ckpt::load_hf_weights(out, layout, vb);
    for (size_t u = 0; u < va.size(); ++u)
      EXPECT_EQ(0, std::memcmp(va[u].data, vb[u].data, va[u].bytes())) << layout.units()[u].name;
    if (!keep) std::filesystem::remove_all(out);
  }
}

// HF import -> train 3 steps -> export: each fixture model (fp32 CPU) takes 3 AdamW steps on
// its golden batch, then its logits on that batch and its export must agree. Read back here:
// the export's weights equal the trained ones bit for bit, and the logits of the model loaded
// from the export equal the trained model's. With EASYCTX_GOLDEN_EXPORT=DIR the exports stay
// in DIR/<fixture>-trained with DIR/<fixture>-trained.logits.safetensors (F64 [B, S, V]), where
// check_export.py has transformers load them and compute the same logits (the GPU host).
TEST(GoldenExport, TrainedThreeStepsThenExportedGivesTheSameLogits) {
  const char* keep = std::getenv("EASYCTX_GOLDEN_EXPORT");
  for (const std::string& name : fixtures({"gqa", "tied_llama3", "qwen2", "qwen3", "yarn"})) {
    SCOPED_TRACE(name);
    const std::string dir = source_dir() + "/tests/golden/data/" + name;
    const model::LlamaConfig cfg = model::load_llama_config(dir + "/model");
    Golden g(dir);
    auto be = ops::make_cpu_backend();
    model::LlamaModel m(cfg, *be, DType::F32, {CheckpointPolicy::None, 7});
    std::vector<ops::Buffer> bufs;
    const std::vector<ops::Tensor> params = alloc_units(*be, m.layout(), DType::F32, bufs);
    const std::vector<ops::Tensor> grads = alloc_units(*be, m.layout(), DType::F32, bufs);
    const std::vector<ops::Tensor> adam_m = alloc_units(*be, m.layout(), DType::F32, bufs);
    const std::vector<ops::Tensor> adam_v = alloc_units(*be, m.layout(), DType::F32, bufs);
    for (const std::vector<ops::Tensor>* moments : {&adam_m, &adam_v})
      for (const ops::Tensor& t : *moments) be->fill(t, 0.0);
    ckpt::load_hf_weights(dir + "/model", m.layout(), params);
    GoldenBatch gb(g);
    const int64_t B = gb.B, S = gb.S, count = gb.labelled;
    const model::Batch b = gb.batch();
    double first = 0, last = 0;
    for (int64_t step = 1; step <= 3; ++step) {
      for (const ops::Tensor& t : grads) be->fill(t, 0.0);
      const ops::LossSums ls = m.forward_backward(params, grads, b, 1.0 / static_cast<double>(count));
      (step == 1 ? first : last) = ls.sum_nll / static_cast<double>(ls.count);
      ops::AdamWStep s;
      s.lr = 1e-2;
      s.weight_decay = 0.1;
      s.step = step;
      for (size_t u = 0; u < params.size(); ++u) be->adamw(params[u], grads[u], adam_m[u], adam_v[u], s);
    }
    EXPECT_LT(last, first) << "3 steps on one batch did not lower its loss";
    const std::vector<double> golden = g.get("logits");
    auto logits_of = [&](const std::vector<ops::Tensor>& p) {
      ops::Buffer l = be->alloc(DType::F32, B * S * cfg.vocab_size);
      m.forward_logits(p, b, l.flat());
      return std::vector<double>(l.flat().ptr<float>(), l.flat().ptr<float>() + l.numel());
    };
    const std::vector<double> trained = logits_of(params);
    EXPECT_GT(rel_error(trained, golden), 1e-3) << "training did not move the logits";

    const std::string out = (keep ? std::string(keep) + "/"
                                  : "/tmp/easyctx-golden-trained-" + std::to_string(test_seed() % 1000000) + "-") +
                            name + "-trained";
    ckpt::save_hf_model(out, cfg, m.layout(), params);
    ckpt::write_safetensors(out + ".logits.safetensors",
                            {{"logits", {B, S, cfg.vocab_size}, trained.data(), DType::F64, ckpt::StDType::F64}});
    const model::LlamaConfig back = model::load_llama_config(out);
    model::LlamaModel mb(back, *be, DType::F32, {CheckpointPolicy::None, 7});
    const std::vector<ops::Tensor> loaded = alloc_units(*be, mb.layout(), DType::F32, bufs);
    ckpt::load_hf_weights(out, mb.layout(), loaded);
    for (size_t u = 0; u < params.size(); ++u)
      EXPECT_EQ(0, std::memcmp(params[u].data, loaded[u].data, params[u].bytes())) << m.layout().units()[u].name;
    EXPECT_EQ(trained, logits_of(loaded));
    if (!keep) {
      std::filesystem::remove_all(out);
      std::filesystem::remove(out + ".logits.safetensors");
    }
  }
}

}  // namespace
}  // namespace easyctx::test

namespace easyctx::test {
namespace {

// LoRA on each golden model (imported as the frozen base): adapters on every projection (A as
// PEFT starts it, B random, not zero), the norms trained (and, untied, the embedding and
// lm_head), their copies moved off the base's values. Its logits on the golden batch; the PEFT
// adapter folder it exports, merged into the fixture's model (easyctx_convert --merge-lora's
// code), gives them in easyctx's full model (1e-5, fp32). With EASYCTX_GOLDEN_EXPORT=DIR the
// folders stay as DIR/<fixture>-lora/{adapter,merged} and DIR/<fixture>-lora.logits.safetensors,
// where check_lora_export.py has transformers load the merged model, and PEFT the base with
// the adapter (PeftModel.from_pretrained), and compare their logits (the GPU host).
TEST(GoldenExport, LoraAdapterAndMergedGiveTheLoraLogits) {
  const char* keep = std::getenv("EASYCTX_GOLDEN_EXPORT");
  for (const std::string name : {"gqa", "tied_llama3", "qwen2", "qwen3"}) {
    SCOPED_TRACE(name);
    const std::string dir = source_dir() + "/tests/golden/data/" + name;
    const model::LlamaConfig cfg = model::load_llama_config(dir + "/model");
    model::ModelOptions o{CheckpointPolicy::Layer, 7};
    o.lora.rank = 4;
    o.lora.alpha = 6;
    o.lora.targets.fill(true);
    o.lora.norm = true;
    o.lora.embed_tokens = o.lora.lm_head = !cfg.tie_word_embeddings;
    auto be = ops::make_cpu_backend();
    model::LlamaModel m(cfg, *be, DType::F32, o);
    const model::ParamLayout base(cfg);
    std::vector<ops::Buffer> bufs;
    const std::vector<ops::Tensor> bp = alloc_units(*be, base, DType::F32, bufs);
    const std::vector<ops::Tensor> lp = alloc_units(*be, m.layout(), DType::F32, bufs);
    ckpt::load_hf_weights(dir + "/model", base, bp);
    std::mt19937_64 rng(test_seed());
    std::normal_distribution<double> nd(0.0, 1.0);
    for (size_t u = 0; u < lp.size(); ++u) {
      const model::ParamUnit& pu = m.layout().units()[u];
      model::init_random_range(m.layout(), u, 0, lp[u], 0.02, test_seed());  // the adapters' A
      for (const model::ParamTensor& t : pu.tensors)
        for (int64_t i = 0; i < t.numel; ++i) {
          float& v = lp[u].ptr<float>()[t.offset + i];
          if (t.adapter && !t.lora_a) v = static_cast<float>(0.05 * nd(rng));  // B: not zero
          if (t.adapter) continue;
          v = bp[static_cast<size_t>(t.base_unit)].ptr<float>()[t.base_offset + i];
          if (!pu.frozen) v *= static_cast<float>(1.0 + 0.1 * nd(rng));  // a trained copy moved
        }
    }
    Golden g(dir);
    GoldenBatch gb(g);
    model::Batch b = gb.batch();
    ops::Buffer ll = be->alloc(DType::F32, gb.B * gb.S * cfg.vocab_size);
    m.forward_logits(lp, b, ll.flat());
    const std::vector<double> lora(ll.flat().ptr<float>(), ll.flat().ptr<float>() + ll.numel());
    EXPECT_GT(rel_error(lora, g.get("logits")), 1e-3) << "the adapters did not move the logits";
    const std::string out =
        (keep ? std::string(keep) + "/" : "/tmp/easyctx-golden-lora-" + std::to_string(test_seed() % 1000000) + "-") +
        name + "-lora";
    std::vector<ops::Tensor> views = lp;
    ckpt::save_lora_adapter(out + "/adapter", m.layout(), views, std::filesystem::absolute(dir + "/model").string());
    ckpt::ConvertOptions co;
    co.merge_lora = out + "/adapter";
    co.to = "hf:" + out + "/merged";
    co.dtype = ckpt::StDType::F32;
    ckpt::convert_model(co);  // (--from: the adapter's base_model_name_or_path, the fixture)
    ckpt::write_safetensors(out + ".logits.safetensors",
                            {{"logits", {gb.B, gb.S, cfg.vocab_size}, lora.data(), DType::F64, ckpt::StDType::F64}});
    model::LlamaModel mf(cfg, *be, DType::F32, {CheckpointPolicy::Layer, 7});
    const std::vector<ops::Tensor> mp = alloc_units(*be, base, DType::F32, bufs);
    ckpt::load_hf_weights(out + "/merged", base, mp);
    ops::Buffer ml = be->alloc(DType::F32, ll.numel());
    mf.forward_logits(mp, b, ml.flat());
    const double err =
        rel_error(std::vector<double>(ml.flat().ptr<float>(), ml.flat().ptr<float>() + ml.numel()), lora);
    std::printf("[accuracy] %s: merged export vs base + adapter logits rel err %.3g\n", name.c_str(), err);
    EXPECT_LT(err, 1e-5);
    if (!keep) {
      std::filesystem::remove_all(out);
      std::filesystem::remove(out + ".logits.safetensors");
    }
  }
}

}  // namespace
}  // namespace easyctx::test
