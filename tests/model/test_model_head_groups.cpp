// ModelOptions::head_groups (activation.attention_head_groups: G) on the CPU backend: the
// attention block tiled over head groups (per group the Q/K/V projections, RoPE, attention
// and the output projection's partial sum, forward and backward) against the untiled layer
// (G = 1), GQA models, every checkpoint policy, MLP untiled and tiled, activation offload:
// - forward (loss) bit-identical when a group's Hq/G x hd is a multiple of the CPU GEMM's
//   256-deep blocks (the O projection's partial sums are then the untiled sum's blocks);
// - every gradient within a few fp32 ulps otherwise (dh sums dq W_Q + dk W_K + dv W_V group
//   by group instead of all of dq's first), and the loss likewise;
// - the workspace is what workspace_specs says, with q, k, v, o, LSE, dq, dk, dv 1/G of G = 1;
// - attention_output + offload (streamed per group) bit for bit attention_output on the device.
#include <cmath>
#include <cstdio>
#include <random>

#include "llama_test_util.h"
#include "model/llama.h"
#include "model_run_util.h"
#include "test_util.h"

namespace easyctx::test {
namespace {

using ops::Buffer;
using ops::DType;
using ops::Tensor;

// 8 query heads over 4 key/value heads (GQA), so G = 2 and 4 divide both.
model::LlamaConfig config(int64_t layers, int64_t head_dim) {
  model::LlamaConfig c = llama_config("head-groups", {24, layers, 8, 4, head_dim, 40, 31});
  c.rope_theta = 1000.0;
  return c;
}

int64_t spec_numel(const std::vector<model::BufferSpec>& specs, const std::string& name) {
  for (const model::BufferSpec& b : specs)
    if (b.name == name) return b.numel;
  ADD_FAILURE() << "no workspace buffer " << name;
  return -1;
}

// The largest difference of b from a in units of a's fp32 spacing at the unit's largest
// magnitude (so values near 0 are not counted in their own tiny ulps).
double max_ulps(const std::vector<float>& a, const std::vector<float>& b) {
  float top = 0;
  for (float x : a) top = std::max(top, std::fabs(x));
  const double ulp = std::nextafter(top, INFINITY) - top;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])) / ulp);
  return worst;
}

// (G, policy, MLP tile, offload)
using Param = std::tuple<int64_t, CheckpointPolicy, int64_t, bool>;
class ModelHeadGroups : public ::testing::TestWithParam<Param> {};

void compare(const model::LlamaConfig& cfg, const Param& prm, bool forward_exact) {
  const auto [G, policy, tile, offload] = prm;
  model::ModelOptions one{policy, 7, tile};
  one.offload_checkpoints = offload;
  model::ModelOptions grouped = one;
  grouped.head_groups = G;
  const uint64_t seed = test_seed();
  const Outcome a = run_model(cfg, one, seed), b = run_model(cfg, grouped, seed);
  if (forward_exact) {
    EXPECT_EQ(a.eval_nll, b.eval_nll);
  } else {
    EXPECT_NEAR(a.eval_nll, b.eval_nll, 1e-5 * std::fabs(a.eval_nll));
  }
  EXPECT_NEAR(a.sum_nll, b.sum_nll, 1e-5 * std::fabs(a.sum_nll));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  double worst = 0;
  for (size_t u = 0; u < a.grads.size(); ++u) {
    const double ulps = max_ulps(a.grads[u], b.grads[u]);
    worst = std::max(worst, ulps);
    EXPECT_LE(ulps, 512.0) << "gradient of unit " << u;  // measured: 10 to 140
  }
  std::printf(
      "[head groups] hd %lld G %lld %s tile %lld offload %d: loss %.17g vs %.17g, eval %s, grads within "
      "%.1f ulps of each unit's largest\n",
      static_cast<long long>(cfg.head_dim), static_cast<long long>(G), to_string(policy), static_cast<long long>(tile),
      offload ? 1 : 0, a.sum_nll, b.sum_nll, a.eval_nll == b.eval_nll ? "bit-identical" : "differs", worst);
  // The workspace: what workspace_specs says, the per-head buffers 1/G of G = 1's (checkpoint
  // none keeps every group's activations: only the gradients shrink).
  const auto s1 = model::LlamaModel::workspace_specs(cfg, one, DType::F32, 2, 11, true);
  const auto sg = model::LlamaModel::workspace_specs(cfg, grouped, DType::F32, 2, 11, true);
  EXPECT_EQ(a.workspace_bytes, spec_bytes(s1));
  EXPECT_EQ(b.workspace_bytes, spec_bytes(sg));
  const bool keep_all = policy == CheckpointPolicy::None;
  for (const char* name : {"acts.0.q", "acts.0.k", "acts.0.v", "acts.0.o", "acts.0.lse"})
    EXPECT_EQ(spec_numel(sg, name) * (keep_all ? 1 : G), spec_numel(s1, name)) << name;
  for (const char* name : {"dq", "dk", "dv"}) EXPECT_EQ(spec_numel(sg, name) * G, spec_numel(s1, name)) << name;
  EXPECT_EQ(spec_numel(sg, "wo_g"), cfg.hidden_size * cfg.q_dim() / G);
  EXPECT_EQ(spec_numel(sg, "dwo_g"), cfg.hidden_size * cfg.q_dim() / G);
}

// Groups of 2 or 4 query heads of 4: Hq/G x hd is not a multiple of 256 (forward within rounding).
TEST_P(ModelHeadGroups, MatchesUntiledLayer) { compare(config(3, 4), GetParam(), false); }

// qwen2's q/k/v biases: each group adds and differentiates its slice of them; qwen3's q/k
// norms: each group normalises its heads with the shared gains, whose gradient sums the groups.
TEST(ModelHeadGroupsQwen, BiasesAndNormsMatchUntiledLayer) {
  for (const char* family : {"qwen2", "qwen3"}) {
    model::LlamaConfig cfg = config(3, 4);
    cfg.model_type = family;
    cfg.qkv_bias = cfg.model_type == "qwen2";
    cfg.qk_norm = cfg.model_type == "qwen3";
    compare(cfg, {2, CheckpointPolicy::Layer, 0, false}, false);
    compare(cfg, {4, CheckpointPolicy::AttentionOutput, 5, true}, false);
    compare(cfg, {2, CheckpointPolicy::None, 0, false}, false);
  }
}

std::vector<Param> params() {
  std::vector<Param> v;
  for (int64_t G : {2, 4})
    for (CheckpointPolicy p : {CheckpointPolicy::None, CheckpointPolicy::Layer, CheckpointPolicy::AttentionOutput})
      for (int64_t tile : {0, 5})
        for (bool off : {false, true})
          if (!(off && p == CheckpointPolicy::None)) v.emplace_back(G, p, tile, off);  // none keeps no checkpoints
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, ModelHeadGroups, ::testing::ValuesIn(params()), [](const auto& info) {
  return "G" + std::to_string(std::get<0>(info.param)) + "_" + to_string(std::get<1>(info.param)) + "_tile" +
         std::to_string(std::get<2>(info.param)) + (std::get<3>(info.param) ? "_offload" : "");
});

// attention_output + offload with G > 1 streams each group's o and LSE to host memory and back
// through two group-sized device slots (Workspace::streamed): the same arithmetic as keeping
// the layer's checkpoint slot on the device, so losses and gradients are bit for bit those of
// attention_output without offload, and the device holds 2 x 1/G of one layer's o and LSE
// while host memory holds every layer's.
TEST(ModelHeadGroupsStreamed, BitIdenticalToAttentionOutputOnDevice) {
  const model::LlamaConfig cfg = config(3, 4);
  for (int64_t G : {2, 4}) {
    for (int64_t tile : {0, 5}) {
      model::ModelOptions kept{CheckpointPolicy::AttentionOutput, 7, tile};
      kept.head_groups = G;
      model::ModelOptions streamed = kept;
      streamed.offload_checkpoints = true;
      const uint64_t seed = test_seed();
      const Outcome a = run_model(cfg, kept, seed), b = run_model(cfg, streamed, seed);
      ASSERT_NO_FATAL_FAILURE(expect_same_outcome(a, b, "G " + std::to_string(G) + " tile " + std::to_string(tile)));
      const auto spec = model::LlamaModel::workspace_specs(cfg, streamed, DType::F32, 2, 11, true);
      EXPECT_EQ(b.workspace_bytes, spec_bytes(spec));
      const int64_t n = 2 * 11, o_layer = n * cfg.q_dim(), lse_layer = 2 * cfg.num_heads * 11;
      int64_t device_o = 0, host_o = 0, host_lse = 0, device_slots = 0;
      for (const model::BufferSpec& bs : spec) {
        if (bs.name.rfind("saved_o.", 0) == 0) device_o += bs.numel, ++device_slots;
        if (bs.name.rfind("host.saved_o.", 0) == 0) host_o += bs.numel;
        if (bs.name.rfind("host.saved_lse.", 0) == 0) host_lse += bs.numel;
      }
      EXPECT_EQ(device_slots, 2);
      EXPECT_EQ(device_o, 2 * o_layer / G);
      EXPECT_EQ(spec_numel(spec, "saved_lse.0"), lse_layer / G);
      EXPECT_EQ(host_o, cfg.num_layers * o_layer);
      EXPECT_EQ(host_lse, cfg.num_layers * lse_layer);
      std::printf(
          "[head groups streamed] G %lld tile %lld: loss %.17g bit-identical; device o slots %lld x %lld, "
          "host %lld layers\n",
          static_cast<long long>(G), static_cast<long long>(tile), b.sum_nll, static_cast<long long>(device_slots),
          static_cast<long long>(o_layer / G), static_cast<long long>(cfg.num_layers));
    }
  }
}

// Head dim 128: groups of 2 or 4 query heads are 256 or 512 deep, whole blocks of the CPU
// GEMM, so the forward (the loss) is bit for bit the untiled one's.
TEST(ModelHeadGroupsAligned, ForwardBitIdentical) {
  for (int64_t G : {2, 4})
    for (CheckpointPolicy p : {CheckpointPolicy::Layer, CheckpointPolicy::AttentionOutput})
      compare(config(2, 128), Param{G, p, 0, p == CheckpointPolicy::AttentionOutput}, true);
}

// G must divide the key/value heads.
TEST(ModelHeadGroupsRefusal, GroupsMustDivideKvHeads) {
  model::ModelOptions mo;
  mo.head_groups = 3;
  EXPECT_THROW(model::LlamaModel::workspace_specs(config(1, 4), mo, DType::F32, 2, 11, true), InputError);
  auto be = ops::make_cpu_backend();
  EXPECT_THROW(model::LlamaModel(config(1, 4), *be, DType::F32, mo), InputError);
}

}  // namespace
}  // namespace easyctx::test
