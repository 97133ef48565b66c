// ModelOptions::offload_checkpoints (activation.offload: cpu) on the CPU backend, which runs
// the offload path with synchronous copies: loss and every gradient bit-identical to the
// checkpoints kept in the workspace, for layer and attention_output, MLP untiled and tiled,
// over 1, 2, 3 and 5 layers (none, some and all of the copies), every layer input offloaded or
// only the first 1 or 2 (activation.offload_layers); the workspace is what workspace_specs
// says (a ring of two of each checkpoint, the rest pinned host buffers or device slots); only
// the last layers keeping their attention outputs (activation.attention_output_layers).
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

model::LlamaConfig config(int64_t layers) {
  model::LlamaConfig c = llama_config("offload", {16, layers, 4, 2, 4, 24, 29});
  c.rope_theta = 1000.0;
  return c;
}

int count(const std::vector<model::BufferSpec>& specs, const std::string& prefix, bool pinned) {
  int k = 0;
  for (const model::BufferSpec& b : specs) k += b.name.rfind(prefix + ".", 0) == 0 && b.pinned_host == pinned;
  return k;
}

// (layers, policy, MLP tile: 0 = untiled, 5 = five tiles of the 22 tokens, the last short,
// offload_layers: 0 = all, else the first 1 or 2 layer inputs only)
class ModelOffload : public ::testing::TestWithParam<std::tuple<int64_t, CheckpointPolicy, int64_t, int64_t>> {};

TEST_P(ModelOffload, BitIdenticalToCheckpointsOnTheDevice) {
  const auto [layers, policy, tile, offload_layers] = GetParam();
  const model::LlamaConfig cfg = config(layers);
  model::ModelOptions kept{policy, 7, tile};
  model::ModelOptions off = kept;
  off.offload_checkpoints = true;
  off.offload_layers = offload_layers;
  const uint64_t seed = test_seed();
  const Outcome a = run_model(cfg, kept, seed), b = run_model(cfg, off, seed);
  ASSERT_NO_FATAL_FAILURE(expect_same_outcome(a, b, "offloaded"));

  // The workspace: the first K layer inputs (and K - 1 attention outputs) in (pinned) host
  // buffers, a ring of two device slots for the checkpoints up to K + 1, one slot each after.
  const auto specs = model::LlamaModel::workspace_specs(cfg, off, DType::F32, 2, 11, true);
  EXPECT_EQ(b.workspace_bytes, spec_bytes(specs));
  EXPECT_EQ(a.workspace_bytes, spec_bytes(model::LlamaModel::workspace_specs(cfg, kept, DType::F32, 2, 11, true)));
  const int64_t K = (offload_layers == 0 || offload_layers > layers - 1) ? layers - 1 : offload_layers;
  const int64_t Ko = std::max<int64_t>(0, K - 1);
  EXPECT_EQ(count(specs, "resid", false), layers + 1 - K > 2 ? layers + 1 - K : 2);
  EXPECT_EQ(count(specs, "host.resid", true), K);
  const bool ao = policy == CheckpointPolicy::AttentionOutput;
  const int64_t saved_dev = layers - Ko > 2 ? layers - Ko : std::min<int64_t>(2, layers);
  EXPECT_EQ(count(specs, "saved_o", false), ao ? saved_dev : 0);
  EXPECT_EQ(count(specs, "saved_lse", false), ao ? saved_dev : 0);
  EXPECT_EQ(count(specs, "host.saved_o", true), ao ? Ko : 0);
  EXPECT_EQ(count(specs, "host.saved_lse", true), ao ? Ko : 0);
}

INSTANTIATE_TEST_SUITE_P(
    All, ModelOffload,
    ::testing::Combine(::testing::Values(int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}),
                       ::testing::Values(CheckpointPolicy::Layer, CheckpointPolicy::AttentionOutput),
                       ::testing::Values(int64_t{0}, int64_t{5}),
                       ::testing::Values(int64_t{0}, int64_t{1}, int64_t{2})),
    [](const auto& info) {
      return "L" + std::to_string(std::get<0>(info.param)) + "_" + to_string(std::get<1>(info.param)) + "_tile" +
             std::to_string(std::get<2>(info.param)) + "_off" + std::to_string(std::get<3>(info.param));
    });

// activation.attention_output_layers: only the last M layers keep their attention output and
// LSE, the others recompute their attention as with checkpoint layer. Losses and every
// gradient bit for bit those of checkpoint layer (same offload, head groups), for M = 1, 2, 4
// of 5 layers, on the device or offloaded (every layer input or the first 2 or 4: the kept
// outputs of layers below offload_layers - 1 leave, through the ring), untiled attention or 2
// head groups (offloaded: streamed, each kept layer's in host memory); the workspace holds M
// outputs (M = L or more: every layer's, as without the key).
TEST(ModelKeptOutputs, LastLayersBitIdenticalToLayer) {
  const int64_t L = 5;
  const model::LlamaConfig cfg = config(L);
  for (int64_t G : {1, 2})
    for (int64_t off_layers : {-1, 0, 2, 4})  // -1: no offload
      for (int64_t M : {1, 2, 4}) {
        const std::string tag =
            "G " + std::to_string(G) + " offload_layers " + std::to_string(off_layers) + " kept " + std::to_string(M);
        model::ModelOptions layer{CheckpointPolicy::Layer, 7, 5};
        layer.head_groups = G;
        layer.offload_checkpoints = off_layers >= 0;
        layer.offload_layers = std::max<int64_t>(0, off_layers);
        model::ModelOptions mixed = layer;
        mixed.checkpoint = CheckpointPolicy::AttentionOutput;
        mixed.attention_output_layers = M;
        const uint64_t seed = test_seed();
        const Outcome a = run_model(cfg, layer, seed), b = run_model(cfg, mixed, seed);
        ASSERT_NO_FATAL_FAILURE(expect_same_outcome(a, b, tag));
        const auto specs = model::LlamaModel::workspace_specs(cfg, mixed, DType::F32, 2, 11, true);
        EXPECT_EQ(b.workspace_bytes, spec_bytes(specs)) << tag;
        const bool streamed = G > 1 && off_layers >= 0;
        const int64_t K = off_layers < 0 ? 0 : off_layers == 0 ? L - 1 : off_layers;
        const int64_t Ko = std::max<int64_t>(0, K - 1 - (L - M));  // kept outputs that leave
        const int64_t dev = streamed ? 2 : M - Ko > 2 ? M - Ko : std::min<int64_t>(2, M);
        EXPECT_EQ(count(specs, "saved_o", false), dev) << tag;
        EXPECT_EQ(count(specs, "saved_lse", false), dev) << tag;
        EXPECT_EQ(count(specs, "host.saved_o", true), streamed ? M : Ko) << tag;
        EXPECT_EQ(count(specs, "host.saved_lse", true), streamed ? M : Ko) << tag;
      }
  // M = L and above: every layer keeps its output, the workspace of attention_output itself.
  model::ModelOptions all{CheckpointPolicy::AttentionOutput, 7, 5};
  for (int64_t M : {L, L + 3}) {
    model::ModelOptions m = all;
    m.attention_output_layers = M;
    EXPECT_EQ(spec_bytes(model::LlamaModel::workspace_specs(cfg, m, DType::F32, 2, 11, true)),
              spec_bytes(model::LlamaModel::workspace_specs(cfg, all, DType::F32, 2, 11, true)));
  }
}

// MLP tiles (activation.mlp_tile): the MLP's input norm runs per tile into a tile-sized h2 (the
// norm is row by row), so the workspace has one [n, D] buffer fewer and the losses stay those of
// the untiled MLP bit for bit (only the MLP weight gradients change their summation order).
TEST(ModelMlpTiles, NormPerTileKeepsTheLossAndShrinksH2) {
  const model::LlamaConfig cfg = config(3);
  for (CheckpointPolicy p : {CheckpointPolicy::Layer, CheckpointPolicy::AttentionOutput}) {
    const model::ModelOptions whole{p, 7, 0}, tiled{p, 7, 5};
    const uint64_t seed = test_seed();
    const Outcome a = run_model(cfg, whole, seed), b = run_model(cfg, tiled, seed);
    EXPECT_EQ(a.sum_nll, b.sum_nll) << to_string(p);
    EXPECT_EQ(a.eval_nll, b.eval_nll) << to_string(p);
    const int64_t n = 2 * 11, d = cfg.hidden_size;
    for (const auto& [mo, rows] : {std::pair{whole, n}, std::pair{tiled, int64_t{5}}}) {
      for (const model::BufferSpec& bs : model::LlamaModel::workspace_specs(cfg, mo, DType::F32, 2, 11, true)) {
        if (bs.name == "acts.0.h2") { EXPECT_EQ(bs.numel, rows * d) << to_string(p); }
      }
    }
  }
}

// Offload moves the checkpoints a policy keeps; with checkpoint none there are none to move.
TEST(ModelOffloadRefusal, NeedsARecomputingPolicy) {
  model::ModelOptions mo{CheckpointPolicy::None, 7, 0};
  mo.offload_checkpoints = true;
  try {
    model::LlamaModel::workspace_specs(config(3), mo, DType::F32, 2, 11, true);
    FAIL() << "offload with checkpoint none was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("offload_checkpoints needs checkpoint policy"), std::string::npos) << e.what();
  }
  // Forward only: nothing is kept, so nothing is offloaded (the same two-buffer stream).
  EXPECT_EQ(spec_bytes(model::LlamaModel::workspace_specs(config(3), mo, DType::F32, 2, 11, false)),
            spec_bytes(model::LlamaModel::workspace_specs(config(3), {}, DType::F32, 2, 11, false)));
}

}  // namespace
}  // namespace easyctx::test
