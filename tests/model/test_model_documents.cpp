// data.document_mask through the whole model on the CPU reference (fp32): two packed windows
// with restarted positions and attention inside each document give the same loss and every
// parameter gradient (1e-6 relative) as each document run alone as its own sequence, the
// gradients summed; for every checkpoint policy, MLP tiles, head groups and offloaded
// checkpoints. Without the mask the same windows give another loss (the test can fail).
#include <algorithm>
#include <random>

#include "llama_test_util.h"
#include "model/llama.h"
#include "test_util.h"

namespace easyctx::test {
namespace {

using ops::Buffer;
using ops::DType;
using ops::Tensor;

struct Params {
  std::vector<Buffer> p, g;
  std::vector<Tensor> pv, gv;
};

Params make_params(ops::Backend& be, const model::LlamaModel& m, uint64_t seed) {
  Params r;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 0.3);
  for (const auto& u : m.layout().units()) {
    r.p.push_back(be.alloc(DType::F32, u.numel));
    r.g.push_back(be.alloc(DType::F32, u.numel));
    for (const auto& t : u.tensors)
      for (int64_t i = 0; i < t.numel; ++i)
        r.p.back().flat().ptr<float>()[t.offset + i] = static_cast<float>((t.is_norm ? 1.0 : 0.0) + nd(rng));
    r.pv.push_back(r.p.back().flat());
    r.gv.push_back(r.g.back().flat());
  }
  return r;
}

std::vector<float> all_grads(const Params& p) {
  std::vector<float> out;
  for (const Buffer& g : p.g) out.insert(out.end(), g.flat().ptr<float>(), g.flat().ptr<float>() + g.numel());
  return out;
}

struct Packed {
  int64_t B = 2, S = 29;
  std::vector<attention::DocumentStarts> docs{{0, 6, 7, 19}, {0, 13}};  // a one-token document
  std::vector<int32_t> tok, pos, lab;
  int64_t labels = 0;
};

// Positions restarting at 0 at each of its sequence's document starts.
void restart_positions(Packed& k) {
  for (int64_t b = 0; b < k.B; ++b) {
    const auto& d = k.docs[static_cast<size_t>(b)];
    for (int64_t i = 0; i < k.S; ++i)
      k.pos[b * k.S + i] = static_cast<int32_t>(i - *(std::upper_bound(d.begin(), d.end(), i) - 1));
  }
}

Packed make_packed(int64_t vocab, uint64_t seed) {
  Packed k;
  std::mt19937_64 rng(seed);
  const int64_t n = k.B * k.S;
  k.tok.resize(n);
  k.pos.resize(n);
  k.lab.resize(n);
  for (int64_t b = 0; b < k.B; ++b) {
    for (int64_t i = 0; i < k.S; ++i) {
      const int64_t at = b * k.S + i;
      k.tok[at] = static_cast<int32_t>(rng() % vocab);
      k.lab[at] = i % 4 == 3 ? -1 : static_cast<int32_t>(rng() % vocab);  // some prompt tokens carry no loss
      k.labels += k.lab[at] >= 0;
    }
  }
  restart_positions(k);
  return k;
}

struct Result {
  double sum_nll = 0;
  std::vector<float> grads;
};

Result packed_run(const model::LlamaConfig& cfg, const model::ModelOptions& mo, Packed k, bool mask, uint64_t seed) {
  auto be = ops::make_cpu_backend();
  model::LlamaModel m(cfg, *be, DType::F32, mo);
  Params p = make_params(*be, m, seed);
  const int64_t n = k.B * k.S;
  model::Batch b{Tensor(k.tok.data(), DType::I32, {n}), Tensor(k.pos.data(), DType::I32, {n}),
                 Tensor(k.lab.data(), DType::I32, {n}), k.B, k.S};
  if (mask) b.documents = &k.docs;
  Result r;
  r.sum_nll = m.forward_backward(p.pv, p.gv, b, 1.0 / static_cast<double>(k.labels)).sum_nll;
  r.grads = all_grads(p);
  return r;
}

// Each document as a sequence of its own (positions 0.., plain causal attention).
Result alone_run(const model::LlamaConfig& cfg, const model::ModelOptions& mo, Packed k, uint64_t seed) {
  auto be = ops::make_cpu_backend();
  model::LlamaModel m(cfg, *be, DType::F32, mo);
  Params p = make_params(*be, m, seed);
  Result r;
  for (int64_t b = 0; b < k.B; ++b) {
    const auto& d = k.docs[static_cast<size_t>(b)];
    for (size_t j = 0; j < d.size(); ++j) {
      const int64_t a = b * k.S + d[j], e = b * k.S + (j + 1 < d.size() ? d[j + 1] : k.S), len = e - a;
      std::vector<int32_t> tok(k.tok.begin() + a, k.tok.begin() + e), pos(k.pos.begin() + a, k.pos.begin() + e),
          lab(k.lab.begin() + a, k.lab.begin() + e);
      const model::Batch one{Tensor(tok.data(), DType::I32, {len}), Tensor(pos.data(), DType::I32, {len}),
                             Tensor(lab.data(), DType::I32, {len}), 1, len};
      r.sum_nll += m.forward_backward(p.pv, p.gv, one, 1.0 / static_cast<double>(k.labels)).sum_nll;
    }
  }
  r.grads = all_grads(p);
  return r;
}

// (policy, MLP tile, head groups, offload)
class ModelDocuments : public ::testing::TestWithParam<std::tuple<CheckpointPolicy, int64_t, int64_t, bool>> {
 protected:
  static model::LlamaConfig config() {
    model::LlamaConfig cfg = llama_config("documents", {16, 3, 4, 2, 4, 24, 29});
    cfg.rope_theta = 1000.0;
    return cfg;
  }
  static model::ModelOptions options() {
    const auto [policy, tile, groups, offload] = GetParam();
    model::ModelOptions mo{policy, 7, tile};
    mo.head_groups = groups;
    mo.offload_checkpoints = offload;
    return mo;
  }
};

TEST_P(ModelDocuments, PackedMatchesEachDocumentAlone) {
  const model::LlamaConfig cfg = config();
  const model::ModelOptions mo = options();
  const uint64_t seed = test_seed();
  const Packed k = make_packed(cfg.vocab_size, seed + 1);
  const Result packed = packed_run(cfg, mo, k, true, seed), alone = alone_run(cfg, mo, k, seed);
  EXPECT_NEAR(packed.sum_nll, alone.sum_nll, 1e-6 * std::abs(alone.sum_nll));
  EXPECT_LT(rel_error(packed.grads, alone.grads), 1e-6);
  const Result unmasked = packed_run(cfg, mo, k, false, seed);
  EXPECT_GT(std::abs(unmasked.sum_nll - alone.sum_nll), 1e-3 * std::abs(alone.sum_nll)) << "the mask changed nothing";
}

// The loader cuts padding into documents of 1,024 tokens (data/doc_balance.h): it must change
// nothing real. A packed window whose last 17 positions are padding (labels -1) gives, bit for
// bit, the same loss and gradients with the padding as one document and as four.
TEST_P(ModelDocuments, PaddingDocumentsChangeNothingReal) {
  const model::LlamaConfig cfg = config();
  const model::ModelOptions mo = options();
  const uint64_t seed = test_seed();
  Packed whole = make_packed(cfg.vocab_size, seed + 1);
  whole.docs = {{0, 6, 7, 12}, {0, 13}};  // the first sequence: padding from 12
  for (int64_t i = 12; i < whole.S; ++i) whole.lab[i] = -1;
  whole.labels = std::count_if(whole.lab.begin(), whole.lab.end(), [](int32_t x) { return x >= 0; });
  Packed cut = whole;
  cut.docs[0] = {0, 6, 7, 12, 16, 20, 27};
  restart_positions(whole);
  restart_positions(cut);
  const Result a = packed_run(cfg, mo, whole, true, seed), b = packed_run(cfg, mo, cut, true, seed);
  EXPECT_EQ(a.sum_nll, b.sum_nll);
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) ASSERT_EQ(a.grads[i], b.grads[i]) << "gradient element " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Policies, ModelDocuments,
    ::testing::Values(std::make_tuple(CheckpointPolicy::None, int64_t{0}, int64_t{1}, false),
                      std::make_tuple(CheckpointPolicy::Layer, int64_t{0}, int64_t{1}, false),
                      std::make_tuple(CheckpointPolicy::Layer, int64_t{5}, int64_t{2}, true),
                      std::make_tuple(CheckpointPolicy::AttentionOutput, int64_t{0}, int64_t{1}, true),
                      std::make_tuple(CheckpointPolicy::AttentionOutput, int64_t{5}, int64_t{2}, false)));

}  // namespace
}  // namespace easyctx::test
