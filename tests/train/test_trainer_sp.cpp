// Sequence parallelism (and data x sequence parallelism) against one rank on whole
// sequences, under mpirun with 2, 3 and 4 ranks: the loss and every parameter gradient of a
// step agree to 1e-5 relative (fp32), three training steps give the same losses, and the
// sequence length (37) is not a multiple of 2W, so the loader pads and masks. The *Documents
// cases pack short documents into every window (data.document_mask, best-fit packing) on
// both sides; the one-rank model under documents is checked against each document alone in
// tests/model/test_model_documents.cpp. The Masked* cases train on loss-weighted windows where
// whole ranks' slices, whole data-parallel replicas, or the whole global batch hold no
// labelled token: finite and equal to the one rank, and a step with no update where nothing is
// labelled.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "data/sampler.h"
#include "data/shard.h"
#include "dist/groups.h"
#include "train/trainer.h"
#include "train_test_util.h"

namespace easyctx::test {
namespace {

struct SpCase {
  SeqParallelMode mode;
  int sp;       // 0: the whole world
  int ulysses;  // usp only
  int accum_1;  // grad_accum of the single-rank reference (= data-parallel size)
  // activation.attention_head_groups of the parallel run (the reference: 1), on a GQA model of
  // 16 query / 8 key-value heads (so each group's 8 / 4 heads split over 2 or 4 Ulysses ranks).
  int64_t groups = 1;
  CheckpointPolicy policy = CheckpointPolicy::Layer;
  bool offload = false;
  bool documents = false;  // data.document_mask on short packed documents
  // The tiny shape as a "qwen2" (q/k/v biases), "qwen3" (q/k norms), "mistral" (a window of 11),
  // "mistral3" (a window of 3), "qwen2_window" (use_sliding_window: a window of 4 in layer 1
  // of 2, layer 0 full) or "dynamic" (rope_scaling dynamic over max_position_embeddings 24: the
  // frequencies of the whole sequence's length on every rank) model.
  const char* family = nullptr;
};

// The model YAML of a family (tiny shape, tied embeddings).
std::string family_yaml(const std::string& f) {
  const std::string type = f == "qwen2_window" ? "qwen2" : f == "mistral3" ? "mistral" : f == "dynamic" ? "llama" : f;
  std::string y = "model_type: " + type +
                  "\nhidden_size: 64\nnum_hidden_layers: 2\nnum_attention_heads: 4\nnum_key_value_heads: 2\n"
                  "head_dim: 16\nintermediate_size: 96\nvocab_size: 256\nmax_position_embeddings: " +
                  (f == "dynamic" ? "24" : "2048") +
                  "\nrms_norm_eps: 1.0e-6\nrope_theta: 1000000.0\ntie_word_embeddings: true\n";
  if (f == "mistral") y += "sliding_window: 11\n";
  if (f == "mistral3") y += "sliding_window: 3\n";
  if (f == "qwen2_window") y += "use_sliding_window: true\nsliding_window: 4\nmax_window_layers: 1\n";
  if (f == "dynamic") y += "rope_scaling:\n  rope_type: dynamic\n  factor: 2.0\n";
  return y;
}
bool windowed_family(const char* f) {
  return f && std::string(f) != "qwen2" && std::string(f) != "qwen3" && std::string(f) != "dynamic";
}

std::string shared_dir(const dist::Runtime& rt, uint64_t& seed) {
  seed = test_seed();
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  std::string path = "/tmp/easyctx-train-sp-" + std::to_string(seed % 1000003) + "-" + std::to_string(rt.size());
  if (rt.rank() == 0) {
    std::filesystem::create_directories(path);
    write_walk_shard(path + "/shard.h5", seed, 80, 10, 90, 256);
    write_walk_shard(path + "/docs.h5", seed + 1, 160, 2, 16, 256);  // several documents per window
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

void check_case(const SpCase& c) {
  int argc = 0;
  char** argv = nullptr;
  dist::Runtime rt(&argc, &argv);
  const int W = rt.size();
  const int sp = c.sp ? c.sp : W;
  if (W % sp != 0) GTEST_SKIP() << "sp " << sp << " does not divide " << W << " ranks";
  uint64_t seed = 0;
  const std::string path = shared_dir(rt, seed);
  StageConfig par = tiny_stage(path + "/shard.h5", path + "/par");
  if (c.groups > 1) {
    par.model.config = path + "/gqa.yaml";
    if (rt.rank() == 0)
      std::ofstream(par.model.config) << "hidden_size: 64\nnum_hidden_layers: 3\nnum_attention_heads: 16\n"
                                         "num_key_value_heads: 8\nhead_dim: 4\nintermediate_size: 96\n"
                                         "vocab_size: 256\nmax_position_embeddings: 2048\nrms_norm_eps: 1.0e-5\n"
                                         "rope_theta: 10000.0\ntie_word_embeddings: false\n";
    MPI_Barrier(MPI_COMM_WORLD);
    par.activation.checkpoint = c.policy;
    if (c.offload) par.activation.offload = OffloadTarget::Cpu;
  }
  if (c.family) {
    par.model.config = path + "/" + c.family + ".yaml";
    if (rt.rank() == 0) std::ofstream(par.model.config) << family_yaml(c.family);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  par.data.seq_length = 37;
  if (c.documents) {
    par.data.path = path + "/docs.h5";
    par.data.document_mask = true;
    par.data.packing = DataPacking::BestFit;
  }
  par.train.batch_size = 2;
  par.train.seed = seed;
  par.parallel.sequence.mode = c.mode;
  par.parallel.sequence.size = sp;
  par.parallel.sequence.ulysses_size = c.ulysses;
  StageConfig one = par;
  one.parallel.sequence.size = 1;
  one.parallel.sequence.ulysses_size = 0;
  one.parallel.sequence.mode = SeqParallelMode::ZigzagRing;
  one.train.grad_accum = W / sp;  // same global batch as dp = W / sp replicas
  one.output.dir = path + "/one";
  par.activation.attention_head_groups = c.groups;
  dist::GroupLayout layout;
  try {
    layout = dist::make_group_layout(par, W, rt.topology().local_size);
  } catch (const InputError& e) { GTEST_SKIP() << e.what(); }
  if (c.mode == SeqParallelMode::Ulysses && (4 % sp != 0)) GTEST_SKIP() << "ulysses: 4 heads over " << sp << " ranks";
  dist::ProcessGroups groups(rt, layout, dist::CommBackend::Mpi, 120);
  auto self = dist::make_comm(MPI_COMM_SELF, "self", dist::CommBackend::Mpi, 120);
  train::Trainer tpar(par, groups), tone(one, *self, *self);

  // One step: loss and every gradient.
  if (c.documents && rt.rank() == 0) ::testing::internal::CaptureStdout();
  const train::StepStats a = tpar.compute_gradients(0);
  if (c.documents && rt.rank() == 0) {  // the first window's work per rank, said once
    const std::string out = ::testing::internal::GetCapturedStdout();
    const bool ulysses = c.mode == SeqParallelMode::Ulysses;
    EXPECT_NE(out.find(ulysses ? "every rank's work is equal" : "attention pairs per"), std::string::npos) << out;
  }
  const train::StepStats b = tone.compute_gradients(0);
  EXPECT_EQ(a.labels, b.labels);
  // MFU's share of a causal square's attention pairs: the same global batch, the same share;
  // below 1 with documents or a window, 1 without.
  EXPECT_DOUBLE_EQ(a.attention_share, b.attention_share);
  if (c.documents || windowed_family(c.family)) {
    EXPECT_GT(b.attention_share, 0.0);
    EXPECT_LT(b.attention_share, 1.0);
  } else {
    EXPECT_EQ(b.attention_share, 1.0);
  }
  if (!c.documents && c.family && std::string(c.family) == "qwen2_window") {
    // One full layer and one with a window of 4 over 37 tokens: (703 + 1 + 2 + 3 + 4 x 34) / (2 x 703).
    EXPECT_DOUBLE_EQ(b.attention_share, (703.0 + 142.0) / 1406.0);
  }
  EXPECT_NEAR(a.loss, b.loss, 1e-5 * b.loss);
  const auto ga = tpar.gradients(), gb = tone.gradients();
  ASSERT_EQ(ga.size(), gb.size());
  for (size_t u = 0; u < ga.size(); ++u) {
    std::vector<float> x(ga[u].ptr<float>(), ga[u].ptr<float>() + ga[u].numel()),
        y(gb[u].ptr<float>(), gb[u].ptr<float>() + gb[u].numel());
    EXPECT_LT(rel_error(x, y), 1e-5) << to_string(c.mode) << " W=" << W << " gradient of "
                                     << tpar.model().layout().units()[u].name;
  }
  // Three optimizer steps: the same losses.
  for (int64_t s = 0; s < 3; ++s) {
    const train::StepStats p = tpar.train_step(s), q = tone.train_step(s);
    EXPECT_NEAR(p.loss, q.loss, 1e-5 * q.loss) << "step " << s;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rt.rank() == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(path);
}

TEST(TrainerSequenceParallel, ZigzagRing) { check_case({SeqParallelMode::ZigzagRing, 0, 0, 1}); }

// activation.offload cpu on the zigzag ring (attention_output: the ring's merged outputs are
// checkpoints too; 4 layers): the same gradients and losses as keeping the checkpoints, bit
// for bit; so do offloading only the first 2 layer inputs (activation.offload_layers) and the
// ring in 2 head groups (activation.attention_head_groups: the layer tiled over head groups,
// within fp32 rounding: the input gradient sums the groups' projections in another order).
void check_same_as_kept(void (*change)(StageConfig&), bool exact = true) {
  int argc = 0;
  char** argv = nullptr;
  dist::Runtime rt(&argc, &argv);
  uint64_t seed = 0;
  const std::string path = shared_dir(rt, seed);
  if (rt.rank() == 0) write_tiny_model(path, 4);
  MPI_Barrier(MPI_COMM_WORLD);
  StageConfig kept = tiny_stage(path + "/shard.h5", path + "/kept");
  kept.model.config = path + "/tiny4.yaml";
  kept.data.seq_length = 37;
  kept.train.seed = seed;
  kept.activation.checkpoint = CheckpointPolicy::AttentionOutput;
  kept.parallel.sequence.mode = SeqParallelMode::ZigzagRing;
  kept.parallel.sequence.size = rt.size();
  StageConfig off = kept;
  change(off);
  off.output.dir = path + "/off";
  dist::ProcessGroups groups(rt, dist::make_group_layout(kept, rt.size(), rt.topology().local_size),
                             dist::CommBackend::Mpi, 120);
  train::Trainer tk(kept, groups), to(off, groups);
  EXPECT_EQ(to.config().activation.checkpoint, CheckpointPolicy::AttentionOutput);  // (auto: what the plan chose)
  EXPECT_FALSE(to.config().activation.checkpoint_auto);
  const train::StepStats a = tk.compute_gradients(0), b = to.compute_gradients(0);
  if (exact) EXPECT_EQ(a.loss, b.loss);
  else EXPECT_NEAR(a.loss, b.loss, 1e-5 * b.loss);
  const auto ga = tk.gradients(), gb = to.gradients();
  ASSERT_EQ(ga.size(), gb.size());
  for (size_t u = 0; u < ga.size(); ++u)
    if (!exact) {
      EXPECT_LT(rel_error(std::vector<float>(ga[u].ptr<float>(), ga[u].ptr<float>() + ga[u].numel()),
                          std::vector<float>(gb[u].ptr<float>(), gb[u].ptr<float>() + gb[u].numel())),
                1e-5)
          << "W=" << rt.size() << " gradient of " << tk.model().layout().units()[u].name;
    } else
      EXPECT_EQ(std::vector<float>(ga[u].ptr<float>(), ga[u].ptr<float>() + ga[u].numel()),
                std::vector<float>(gb[u].ptr<float>(), gb[u].ptr<float>() + gb[u].numel()))
          << "W=" << rt.size() << " gradient of " << tk.model().layout().units()[u].name;
  for (int64_t s = 0; s < 3; ++s) {
    const double x = tk.train_step(s).loss, y = to.train_step(s).loss;
    if (exact) EXPECT_EQ(x, y) << "step " << s;
    else EXPECT_NEAR(x, y, 1e-5 * x) << "step " << s;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rt.rank() == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(path);
}
TEST(TrainerSequenceParallel, ZigzagRingActivationOffload) {
  check_same_as_kept([](StageConfig& c) { c.activation.offload = OffloadTarget::Cpu; });
}
// activation.checkpoint auto: every rank's plan (host memory to spare for the tiny model)
// chooses attention_output in every layer, agreed over the ranks: the kept run, bit for bit.
TEST(TrainerSequenceParallel, ZigzagRingCheckpointAuto) {
  check_same_as_kept([](StageConfig& c) {
    c.activation.checkpoint = CheckpointPolicy::Layer;
    c.activation.checkpoint_auto = true;
  });
}
TEST(TrainerSequenceParallel, ZigzagRingPartialOffloadAndHeadGroups) {
  check_same_as_kept([](StageConfig& c) {
    c.activation.offload = OffloadTarget::Cpu;
    c.activation.offload_layers = 2;
  });
  check_same_as_kept([](StageConfig& c) { c.activation.attention_head_groups = 2; }, false);
}

// The layer tiled over 2 head groups in every sequence-parallel mode (the strategy runs on each
// group's heads), against one rank on whole sequences without head groups: layer,
// attention_output with activation offload, none.
TEST(TrainerSequenceParallel, HeadGroupsZigzagRing) {
  check_case({SeqParallelMode::ZigzagRing, 0, 0, 1, 2});
  check_case({SeqParallelMode::ZigzagRing, 0, 0, 1, 2, CheckpointPolicy::AttentionOutput, true});
}
TEST(TrainerSequenceParallel, HeadGroupsDistFlash) {
  check_case({SeqParallelMode::DistFlash, 0, 0, 1, 2, CheckpointPolicy::None});
}
TEST(TrainerSequenceParallel, HeadGroupsUlysses) {
  check_case({SeqParallelMode::Ulysses, 0, 0, 1, 2, CheckpointPolicy::AttentionOutput});
}
TEST(TrainerSequenceParallel, HeadGroupsUsp) {
  int w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  if (w % 2 != 0) GTEST_SKIP() << "usp with ulysses 2 needs an even world, got " << w;
  check_case({SeqParallelMode::Usp, 0, 2, 1, 2, CheckpointPolicy::Layer, true});
}
TEST(TrainerSequenceParallel, DistFlash) { check_case({SeqParallelMode::DistFlash, 0, 0, 1}); }
TEST(TrainerSequenceParallel, Ulysses) { check_case({SeqParallelMode::Ulysses, 0, 0, 1}); }
// Ulysses 2 inside x zigzag ring across (W = 2: ring of 1; W = 4: 2 x 2).
TEST(TrainerSequenceParallel, Usp) {
  int w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  if (w % 2 != 0) GTEST_SKIP() << "usp with ulysses 2 needs an even world, got " << w;
  check_case({SeqParallelMode::Usp, 0, 2, 1});
}
// Data x sequence parallel: 2 sequence-parallel ranks per replica.
TEST(TrainerSequenceParallel, DataTimesZigzag) {
  int w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  if (w < 4) GTEST_SKIP() << "needs 4 ranks for 2 x 2";
  check_case({SeqParallelMode::ZigzagRing, 2, 0, 2});
  check_case({SeqParallelMode::ZigzagRing, 2, 0, 2, 1, CheckpointPolicy::Layer, false, true});
}

// qwen2 (q/k/v biases), qwen3 (q/k norms), mistral (a sliding window of 11 of the 37 tokens:
// ring blocks beyond it skipped; and of 3, smaller than a rank's chunk of 5-10 tokens, so
// whole ring steps and dist_flash offsets are skipped), qwen2 with per-layer windows (a
// window of 4 in its second layer only) and dynamic-RoPE (each rank holds part of the 37
// positions, past max_position_embeddings 24) models, tied embeddings, in every mode.
TEST(TrainerSequenceParallel, QwenEveryMode) {
  int w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  for (const char* f : {"qwen2", "qwen3", "mistral", "mistral3", "qwen2_window", "dynamic"}) {
    check_case({SeqParallelMode::ZigzagRing, 0, 0, 1, 1, CheckpointPolicy::Layer, false, false, f});
    check_case({SeqParallelMode::DistFlash, 0, 0, 1, 1, CheckpointPolicy::Layer, false, false, f});
    if (w % 2 != 0) continue;  // ulysses (4 heads) and usp (ulysses 2) need an even world
    check_case({SeqParallelMode::Ulysses, 0, 0, 1, 1, CheckpointPolicy::Layer, false, false, f});
    check_case({SeqParallelMode::Usp, 0, 2, 1, 1, CheckpointPolicy::Layer, false, false, f});
  }
}

// Packed documents under data.document_mask in every mode (zigzag with the attention output
// kept and offloaded, dist_flash without checkpoints, head groups on Ulysses).
TEST(TrainerSequenceParallel, DocumentsZigzagRing) {
  check_case({SeqParallelMode::ZigzagRing, 0, 0, 1, 1, CheckpointPolicy::Layer, false, true});
  check_case({SeqParallelMode::ZigzagRing, 0, 0, 1, 2, CheckpointPolicy::AttentionOutput, true, true});
}
TEST(TrainerSequenceParallel, DocumentsDistFlash) {
  check_case({SeqParallelMode::DistFlash, 0, 0, 1, 1, CheckpointPolicy::None, false, true});
}
// Documents with per-layer windows, with a window of 3, with dynamic RoPE (its length the
// longest document: positions restart in each).
TEST(TrainerSequenceParallel, DocumentsWithWindows) {
  check_case({SeqParallelMode::ZigzagRing, 0, 0, 1, 1, CheckpointPolicy::Layer, false, true, "qwen2_window"});
  check_case({SeqParallelMode::DistFlash, 0, 0, 1, 1, CheckpointPolicy::AttentionOutput, false, true, "mistral3"});
  check_case({SeqParallelMode::ZigzagRing, 0, 0, 1, 1, CheckpointPolicy::Layer, false, true, "dynamic"});
}
TEST(TrainerSequenceParallel, DocumentsUlysses) {
  check_case({SeqParallelMode::Ulysses, 0, 0, 1, 1, CheckpointPolicy::Layer, false, true});
}
TEST(TrainerSequenceParallel, DocumentsUsp) {
  int w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  if (w % 2 != 0) GTEST_SKIP() << "usp with ulysses 2 needs an even world, got " << w;
  check_case({SeqParallelMode::Usp, 0, 2, 1, 1, CheckpointPolicy::Layer, false, true});
}

// ---- slices and replicas without a labelled token ----------------------------------------
// A shard of 37-token documents with loss weights, read as windows of 37 (window j is document
// j and the next one's first token, weighted 0): a "tail" document weights only its last 3
// tokens (labels at positions 33..35, so every rank that holds none of them has no labelled
// token in that window: a fully masked slice), a "none" document none (a window without labels),
// a "some" document random 0/1. Returns the kinds (0 tail, 1 none, 2 some).
std::vector<int> write_masked_shard(const std::string& path, uint64_t seed, int docs) {
  std::mt19937_64 rng(seed);
  data::ShardMeta meta;
  meta.tokenizer_name = "synthetic";
  meta.tokenizer_sha256 = std::string(64, '0');
  meta.vocab_size = 256;
  meta.has_loss_weights = true;
  data::TokenShardWriter w(path, meta, 4096);
  const uint16_t src = w.source_index("masked");
  std::vector<int> kinds;
  for (int d = 0; d < docs; ++d) {
    const int kind = static_cast<int>(rng() % 5) / 2;  // 2/5 tail, 2/5 none, 1/5 some
    std::vector<uint32_t> ids(37);
    std::vector<uint8_t> wt(37, 0);
    for (int i = 0; i < 37; ++i) {
      ids[i] = static_cast<uint32_t>(3 + rng() % 253);
      wt[i] = i > 0 && (kind == 0 ? i >= 34 : kind == 2 ? rng() % 2 : 0);
    }
    w.add_document(ids.data(), ids.size(), src, wt.data());
    kinds.push_back(kind);
  }
  w.commit();
  return kinds;
}

// `sp` ranks per sequence (0: the whole world; 1: data parallel only) against one rank with
// grad_accum = the data-parallel size, on steps chosen from the data: one whose windows are all
// "tail" or "none" (so whole slices, and with data parallelism perhaps whole replicas, have no
// labelled token while the global batch has some), one with no labelled token at all (a step
// with no update on both), one where a whole data-parallel replica has none, and a plain one. Every rank's
// loss and gradients stay finite and equal the single rank's; the weights after the steps too.
void check_masked(SeqParallelMode mode, int sp_arg, int ulysses) {
  int argc = 0;
  char** argv = nullptr;
  dist::Runtime rt(&argc, &argv);
  const int W = rt.size(), sp = sp_arg ? sp_arg : W;
  if (W % sp != 0) GTEST_SKIP() << "sp " << sp << " does not divide " << W << " ranks";
  uint64_t seed = test_seed();
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  const std::string path = "/tmp/easyctx-train-masked-" + std::to_string(seed % 1000003) + "-" + std::to_string(W);
  const int docs = 400;
  std::vector<int> all(docs);  // (rank 0 writes the shard; every rank picks the same steps)
  if (rt.rank() == 0) {
    std::filesystem::create_directories(path);
    all = write_masked_shard(path + "/masked.h5", seed, docs);
  }
  MPI_Bcast(all.data(), docs, MPI_INT, 0, MPI_COMM_WORLD);
  StageConfig par = tiny_stage(path + "/masked.h5", path + "/par");
  par.data.seq_length = 37;
  par.train.batch_size = 2;
  par.train.seed = seed;
  par.parallel.sequence.mode = mode;
  par.parallel.sequence.size = sp;
  par.parallel.sequence.ulysses_size = ulysses;
  StageConfig one = par;
  one.parallel.sequence.size = 1;
  one.parallel.sequence.ulysses_size = 0;
  one.parallel.sequence.mode = SeqParallelMode::ZigzagRing;
  one.train.grad_accum = W / sp;
  one.output.dir = path + "/one";
  dist::ProcessGroups groups(rt, dist::make_group_layout(par, W, rt.topology().local_size), dist::CommBackend::Mpi,
                             120);
  auto self = dist::make_comm(MPI_COMM_SELF, "self", dist::CommBackend::Mpi, 120);
  train::Trainer tpar(par, groups), tone(one, *self, *self);
  // The steps, from the windows each global batch draws.
  const data::WindowSampler sampler(static_cast<uint64_t>(docs) * 37, 37, seed);
  const data::BatchShape shape{2, 1, W / sp};
  int64_t masked = -1, empty = -1, replica = -1, plain = -1;
  for (int64_t s = 0; s < 4000 && (masked < 0 || empty < 0 || plain < 0 || (replica < 0 && W / sp > 1)); ++s) {
    std::vector<int> per_replica(static_cast<size_t>(W / sp), 0), kind_count(3, 0);
    for (int64_t p = 0; p < W / sp; ++p)
      for (int64_t b = 0; b < 2; ++b) {
        const int k = all[sampler.window_start(data::sample_index(shape, s, 0, p, b)) / 37];
        ++kind_count[static_cast<size_t>(k)];
        per_replica[static_cast<size_t>(p)] += k != 1;
      }
    if (masked < 0 && kind_count[2] == 0 && kind_count[0] > 0) masked = s;
    if (plain < 0 && kind_count[2] > 0) plain = s;
    if (empty < 0 && kind_count[0] + kind_count[2] == 0) empty = s;
    if (replica < 0 && kind_count[0] + kind_count[2] > 0 &&
        std::find(per_replica.begin(), per_replica.end(), 0) != per_replica.end())
      replica = s;
  }
  ASSERT_GE(masked, 0);
  ASSERT_GE(empty, 0);
  ASSERT_GE(plain, 0);
  const train::StepStats a = tpar.compute_gradients(masked), b = tone.compute_gradients(masked);
  EXPECT_FALSE(a.no_labels);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_TRUE(std::isfinite(a.loss)) << to_string(mode) << " W=" << W << " step " << masked;
  EXPECT_NEAR(a.loss, b.loss, 1e-5 * b.loss);
  const auto ga = tpar.gradients(), gb = tone.gradients();
  for (size_t u = 0; u < ga.size(); ++u) {
    std::vector<float> x(ga[u].ptr<float>(), ga[u].ptr<float>() + ga[u].numel()),
        y(gb[u].ptr<float>(), gb[u].ptr<float>() + gb[u].numel());
    EXPECT_TRUE(std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); }))
        << to_string(mode) << " W=" << W << " rank " << rt.rank() << ": a non-finite gradient of "
        << tpar.model().layout().units()[u].name;
    EXPECT_LT(rel_error(x, y), 1e-5) << to_string(mode) << " W=" << W << " gradient of "
                                     << tpar.model().layout().units()[u].name;
  }
  std::vector<int64_t> steps{masked, empty};
  if (replica >= 0) steps.push_back(replica);
  steps.push_back(plain);
  for (const int64_t s : steps) {
    const auto before = tone.master_host();
    const train::StepStats p = tpar.train_step(s), q = tone.train_step(s);
    EXPECT_EQ(p.no_labels, q.no_labels) << "step " << s;
    EXPECT_EQ(p.no_labels, s == empty) << "step " << s;
    if (q.no_labels) {
      EXPECT_EQ(tone.master_host(), before) << "a step without labels moved the weights";
      continue;
    }
    EXPECT_TRUE(std::isfinite(p.loss) && std::isfinite(p.grad_norm)) << "step " << s;
    EXPECT_NEAR(p.loss, q.loss, 1e-5 * q.loss) << "step " << s;
  }
  EXPECT_EQ(tpar.updates(), static_cast<int64_t>(steps.size()) - 1);
  EXPECT_EQ(tpar.steps_without_labels(), 1);
  const auto wp = tpar.master_host(), wo = tone.master_host();
  // (after Adam's first updates, which are near sign(gradient), fp32 rounding shows a little more)
  for (size_t u = 0; u < wp.size(); ++u) EXPECT_LT(rel_error(wp[u], wo[u]), 1e-3) << "weights of unit " << u;
  MPI_Barrier(MPI_COMM_WORLD);
  if (rt.rank() == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(path);
}

TEST(TrainerSequenceParallel, MaskedSlicesZigzagRing) { check_masked(SeqParallelMode::ZigzagRing, 0, 0); }
TEST(TrainerSequenceParallel, MaskedSlicesDistFlash) { check_masked(SeqParallelMode::DistFlash, 0, 0); }
TEST(TrainerSequenceParallel, MaskedSlicesUlysses) { check_masked(SeqParallelMode::Ulysses, 0, 0); }
TEST(TrainerSequenceParallel, MaskedSlicesUsp) { check_masked(SeqParallelMode::Usp, 0, 2); }
TEST(TrainerSequenceParallel, MaskedReplicasDataParallel) { check_masked(SeqParallelMode::ZigzagRing, 1, 0); }
TEST(TrainerSequenceParallel, MaskedDataTimesZigzag) {
  int w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  if (w < 4) GTEST_SKIP() << "needs 4 ranks for 2 x 2";
  check_masked(SeqParallelMode::ZigzagRing, 2, 0);
}

}  // namespace
}  // namespace easyctx::test
