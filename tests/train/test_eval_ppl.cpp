// Perplexity sweep: the incremental one-pass scoring equals scoring each (document,
// length) separately; selection takes the first K documents with >= L tokens.
#include <cmath>

#include "ckpt/hf_model.h"
#include "core/strings.h"
#include "eval/perplexity.h"
#include "model/llama.h"
#include "train_test_util.h"

namespace easyctx::test {
namespace {

using ops::DType;

TEST(EvalPpl, MatchesPerDocumentScoring) {
  TempDir dir("ppl");
  const auto docs = write_walk_shard(dir / "shard.h5", test_seed(), 9, 5, 40, 256);
  const model::LlamaConfig cfg = model::load_llama_config("tiny");
  auto be = ops::make_cpu_backend();
  model::LlamaModel m(cfg, *be, DType::F32, {CheckpointPolicy::None, 5});
  std::vector<ops::Buffer> bufs;
  std::vector<ops::Tensor> params;
  for (const auto& u : m.layout().units()) {
    bufs.push_back(be->alloc(DType::F32, u.numel));
    params.push_back(bufs.back().flat());
  }
  model::init_random(m.layout(), params, 0.3, test_seed());
  ckpt::save_hf_model(dir / "model", cfg, m.layout(), params);

  eval::PplOptions o;
  o.model_dir = dir / "model";
  o.tokenized = {dir.path()};
  o.min_tokens = 6;
  o.max_tokens = 30;
  o.tokens_step = 8;
  o.samples = 3;
  o.lm_head_tile = 7;
  o.mlp_tile = 5;  // the evaluation's MLP in tiles; the reference below runs it untiled
  const std::vector<eval::PplRow> rows = eval::evaluate_perplexity(o, nullptr);
  ASSERT_EQ(rows.size(), 4u);  // 6, 14, 22, 30
  for (const eval::PplRow& r : rows) {
    double sum = 0;
    int64_t n = 0;
    for (const auto& d : docs) {
      if (static_cast<int64_t>(d.size()) < r.tokens || n == o.samples) continue;
      std::vector<int32_t> tok(d.begin(), d.begin() + r.tokens), pos(static_cast<size_t>(r.tokens)),
          lab(pos.size(), -1);
      for (int64_t i = 0; i < r.tokens; ++i) {
        pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
        if (i + 1 < r.tokens) lab[static_cast<size_t>(i)] = tok[static_cast<size_t>(i + 1)];
      }
      model::Batch b{ops::Tensor(tok.data(), DType::I32, {r.tokens}), ops::Tensor(pos.data(), DType::I32, {r.tokens}),
                     ops::Tensor(lab.data(), DType::I32, {r.tokens}), 1, r.tokens};
      const ops::LossSums ls = m.forward_loss(params, b);
      EXPECT_EQ(ls.count, r.tokens - 1);
      sum += ls.sum_nll / static_cast<double>(ls.count);
      ++n;
    }
    EXPECT_EQ(r.documents, n) << "L " << r.tokens;
    if (n == 0) {
      EXPECT_TRUE(std::isnan(r.ppl));
      continue;
    }
    EXPECT_NEAR(r.ppl, std::exp(sum / static_cast<double>(n)), 1e-4 * r.ppl) << "L " << r.tokens;
  }
  const std::string csv = eval::ppl_csv(rows);
  EXPECT_TRUE(starts_with(csv, "tokens,ppl,documents,nll\n")) << csv;
}

TEST(EvalPpl, BadFlagsNameTheFlag) {
  eval::PplOptions o;
  o.model_dir = "x";
  o.tokenized = {"y"};
  o.min_tokens = 100;
  o.max_tokens = 50;
  o.tokens_step = 10;
  try {
    eval::evaluate_perplexity(o, nullptr);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--max-tokens"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace easyctx::test
