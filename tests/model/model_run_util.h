// The model tests' run of a LlamaModel on the CPU backend with fresh random weights and
// batches (test_model_offload.cpp, test_model_head_groups.cpp): its losses, its gradients and
// the workspace it allocated, to compare two ModelOptions of one config.
#pragma once
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model/llama.h"
#include "test_util.h"

namespace easyctx::test {

struct Outcome {
  double sum_nll = 0, eval_nll = 0;
  std::vector<std::vector<float>> grads;
  int64_t workspace_bytes = 0;  // what forward_backward allocated (the backend's counters)
};

// Two accumulating forward_backward calls on different batches (the second reuses the
// workspace and its copy fences), then a forward-only loss (a workspace without checkpoints).
inline Outcome run_model(const model::LlamaConfig& cfg, model::ModelOptions mo, uint64_t seed) {
  auto be = ops::make_cpu_backend();
  model::LlamaModel m(cfg, *be, ops::DType::F32, mo);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 0.3);
  std::vector<ops::Buffer> pb, gb;
  std::vector<ops::Tensor> p, g;
  for (const auto& u : m.layout().units()) {
    pb.push_back(be->alloc(ops::DType::F32, u.numel));
    gb.push_back(be->alloc(ops::DType::F32, u.numel));
    for (const auto& t : u.tensors)
      for (int64_t i = 0; i < t.numel; ++i)
        pb.back().flat().ptr<float>()[t.offset + i] = static_cast<float>((t.is_norm ? 1.0 : 0.0) + nd(rng));
    p.push_back(pb.back().flat());
    g.push_back(gb.back().flat());
  }
  const int64_t B = 2, S = 11, n = B * S;
  std::vector<int32_t> tok(n), pos(n), lab(n);
  const model::Batch b{ops::Tensor(tok.data(), ops::DType::I32, {n}), ops::Tensor(pos.data(), ops::DType::I32, {n}),
                       ops::Tensor(lab.data(), ops::DType::I32, {n}), B, S};
  Outcome r;
  for (int call = 0; call < 2; ++call) {
    for (int64_t i = 0; i < n; ++i) {
      tok[i] = static_cast<int32_t>(rng() % cfg.vocab_size);
      lab[i] = i % 5 == 4 ? -1 : static_cast<int32_t>(rng() % cfg.vocab_size);
      pos[i] = static_cast<int32_t>(i % S + 3 * (i / S));
    }
    const int64_t before = be->memory_stats().live_bytes;
    r.sum_nll += m.forward_backward(p, g, b, 0.1).sum_nll;
    if (call == 0) r.workspace_bytes = be->memory_stats().live_bytes - before;
  }
  r.eval_nll = m.forward_loss(p, b).sum_nll;
  for (const ops::Buffer& x : gb) r.grads.emplace_back(x.flat().ptr<float>(), x.flat().ptr<float>() + x.numel());
  return r;
}

// Two runs the same to the last bit: both losses and every gradient (`tag` names the case).
// Call through ASSERT_NO_FATAL_FAILURE: unequal gradient counts end the test.
inline void expect_same_outcome(const Outcome& a, const Outcome& b, const std::string& tag) {
  EXPECT_EQ(a.sum_nll, b.sum_nll) << tag;
  EXPECT_EQ(a.eval_nll, b.eval_nll) << tag;
  ASSERT_EQ(a.grads.size(), b.grads.size()) << tag;
  for (size_t u = 0; u < a.grads.size(); ++u)
    EXPECT_EQ(std::memcmp(a.grads[u].data(), b.grads[u].data(), a.grads[u].size() * sizeof(float)), 0)
        << "gradient of unit " << u << ", " << tag;
}

inline int64_t spec_bytes(const std::vector<model::BufferSpec>& specs) {
  int64_t s = 0;
  for (const model::BufferSpec& b : specs) s += b.numel * static_cast<int64_t>(ops::element_size(b.dtype));
  return s;
}

}  // namespace easyctx::test
