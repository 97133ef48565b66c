// A throwaway eval::Session for the tests, before the inference engine lands: one rank, the
// CPU, fp32, a Hugging Face folder scored with LlamaModel::forward_logits (full logits, so
// small prompts only). Tests only: the production Session is eval::open_session.
#pragma once
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "ckpt/hf_model.h"
#include "eval/session.h"
#include "model/llama.h"

namespace easyctx::test {

class CpuTestSession : public eval::Session {
 public:
  explicit CpuTestSession(const std::string& dir, double rope_theta = 0)
      : cfg_(model::load_llama_config(dir)), be_(ops::make_cpu_backend()) {
    if (rope_theta > 0) cfg_.rope_theta = rope_theta;
    model_ = std::make_unique<model::LlamaModel>(cfg_, *be_, ops::DType::F32,
                                                 model::ModelOptions{CheckpointPolicy::None, 4096});
    for (const auto& u : model_->layout().units()) {
      bufs_.push_back(be_->alloc(ops::DType::F32, u.numel));
      params_.push_back(bufs_.back().flat());
    }
    ckpt::load_hf_weights(dir, model_->layout(), params_);
  }

  std::vector<std::vector<eval::SpanScore>> score_spans(const std::vector<eval::ScoreRequest>& requests) override {
    std::vector<std::vector<eval::SpanScore>> out;
    for (const eval::ScoreRequest& r : requests) {
      const int64_t n = static_cast<int64_t>(r.tokens.size()), V = cfg_.vocab_size;
      std::vector<int32_t> tok(r.tokens), pos(static_cast<size_t>(n)), lab(static_cast<size_t>(n), -1);
      for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
      model::Batch b{ops::Tensor(tok.data(), ops::DType::I32, {n}), ops::Tensor(pos.data(), ops::DType::I32, {n}),
                     ops::Tensor(lab.data(), ops::DType::I32, {n}), 1, n};
      std::vector<float> logits(static_cast<size_t>(n * V));
      model_->forward_logits(params_, b, ops::Tensor(logits.data(), ops::DType::F32, {n, V}));
      std::vector<eval::SpanScore> spans;
      for (const auto& sp : r.spans) {
        eval::SpanScore s;
        s.all_argmax = true;
        for (int64_t p = sp.begin; p < sp.begin + sp.length; ++p) {
          const float* row = &logits[static_cast<size_t>(p * V)];
          const int32_t next = r.tokens[static_cast<size_t>(p + 1)];
          int64_t best = 0;
          double mx = -std::numeric_limits<double>::infinity(), z = 0;
          for (int64_t v = 0; v < V; ++v)
            if (row[v] > mx) mx = row[v], best = v;
          for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(row[v]) - mx);
          s.sum_nll += std::log(z) + mx - row[next];
          s.all_argmax = s.all_argmax && best == next;
          ++s.count;
        }
        spans.push_back(s);
      }
      out.push_back(spans);
    }
    return out;
  }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t bos_id() const override { return cfg_.bos_token_id; }
  std::string describe() const override { return "cpu (test session, 1 rank)"; }

 private:
  model::LlamaConfig cfg_;
  std::unique_ptr<ops::Backend> be_;
  std::unique_ptr<model::LlamaModel> model_;
  std::vector<ops::Buffer> bufs_;
  std::vector<ops::Tensor> params_;
};

}  // namespace easyctx::test
