// Helpers for the evaluation tests: a small random Llama written as a Hugging Face folder into
// a folder every rank sees, and greedy continuations (the model's argmax tokens).
#pragma once
#include <mpi.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "ckpt/hf_model.h"
#include "llama_test_util.h"
#include "model/llama.h"
#include "train/train_test_util.h"

namespace easyctx::test {

// GQA (4 query heads over 2 key/value heads), untied, two layers.
inline model::LlamaConfig eval_test_config() {
  model::LlamaConfig c = llama_config("eval-test", {32, 2, 4, 2, 8, 48, 101});
  c.rope_theta = 1000.0;
  c.max_position_embeddings = 4096;
  return c;
}

// f32 units of a random model (std 0.3: logits peaked enough for a robust argmax, calm enough that rounding differences
// between layouts stay near 1e-6).
struct HostModel {
  model::LlamaConfig cfg;
  std::unique_ptr<ops::Backend> be = ops::make_cpu_backend();
  std::unique_ptr<model::LlamaModel> m;
  std::vector<ops::Buffer> buf;
  std::vector<ops::Tensor> params;
  HostModel(const model::LlamaConfig& c, uint64_t seed) : cfg(c) {
    m = std::make_unique<model::LlamaModel>(cfg, *be, ops::DType::F32);
    for (const auto& u : m->layout().units()) {
      buf.push_back(be->alloc(ops::DType::F32, u.numel));
      params.push_back(buf.back().flat());
    }
    model::init_random(m->layout(), params, 0.3, seed);
  }
  // `prompt` followed by k tokens, each the argmax of the model after what precedes it.
  std::vector<int32_t> greedy(std::vector<int32_t> prompt, int k) {
    for (int i = 0; i < k; ++i) {
      const int64_t n = static_cast<int64_t>(prompt.size());
      std::vector<int32_t> pos(static_cast<size_t>(n)), lab(static_cast<size_t>(n), -1);
      for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t);
      std::vector<float> logits(static_cast<size_t>(n * cfg.vocab_size));
      model::Batch b{ops::Tensor(prompt.data(), ops::DType::I32, {n}), ops::Tensor(pos.data(), ops::DType::I32, {n}),
                     ops::Tensor(lab.data(), ops::DType::I32, {n}), 1, n};
      m->forward_logits(params, b, ops::Tensor(logits.data(), ops::DType::F32, {n, cfg.vocab_size}));
      const float* l = logits.data() + (n - 1) * cfg.vocab_size;
      prompt.push_back(static_cast<int32_t>(std::max_element(l, l + cfg.vocab_size) - l));
    }
    return prompt;
  }
};

}  // namespace easyctx::test
