// Sequence parallelism on GPUs (label gpu):
//  - RingMergeErrorDoesNotGrow (1 GPU): causal attention computed as W key blocks merged in
//    fp32, W = 1 .. 16, against the CPU on the same bf16 inputs; the error stays at one
//    block's bf16 level instead of growing with the number of ring steps.
//  - TwoGpus.* (mpirun -np 2, 2 GPUs, NCCL): each mode with W = 2 (zigzag_ring, ulysses,
//    dist_flash, usp) trains like one GPU on whole sequences within bf16 tolerance.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "cuda_test_util.h"
#include "dist/groups.h"
#include "train/trainer.h"
#include "../train/train_test_util.h"

namespace easyctx::test {
namespace {

class CudaRing : public CudaOpsTest {};

TEST_F(CudaRing, RingMergeErrorDoesNotGrow) {
  const int64_t S = 4096, Hq = 8, Hkv = 2, hd = 64;
  auto q = rand(static_cast<size_t>(S * Hq * hd), DType::BF16, -2, 2);
  auto k = rand(static_cast<size_t>(S * Hkv * hd), DType::BF16, -2, 2);
  auto v = rand(static_cast<size_t>(S * Hkv * hd), DType::BF16);
  std::vector<float> ref(q.size()), ref_lse(static_cast<size_t>(Hq * S));
  ops::AttentionBlock full;
  full.scale = 1.0 / std::sqrt(static_cast<double>(hd));
  cpu->attention_fwd(host(q, {1, S, Hq, hd}), host(k, {1, S, Hkv, hd}), host(v, {1, S, Hkv, hd}), full,
                     host(ref, {1, S, Hq, hd}), host(ref_lse, {1, Hq, S}));
  Buffer gq = upload(q, DType::BF16), gk = upload(k, DType::BF16), gv = upload(v, DType::BF16);
  std::vector<double> errs;
  for (int64_t W : {1, 2, 4, 8, 16}) {
    const int64_t c = S / W;
    Buffer acc = gpu->alloc(DType::F32, S * Hq * hd), lse = gpu->alloc(DType::F32, Hq * S);
    Buffer ob = gpu->alloc(DType::BF16, S * Hq * hd), lb = gpu->alloc(DType::F32, Hq * S);
    for (int64_t w = 0; w < W; ++w) {
      ops::AttentionBlock blk = full;
      blk.k_offset = w * c;  // causal with offsets: rows before the block see nothing (lse -inf)
      gpu->attention_fwd(gq.view({1, S, Hq, hd}), gk.flat().slice_flat(w * c * Hkv * hd, {1, c, Hkv, hd}),
                         gv.flat().slice_flat(w * c * Hkv * hd, {1, c, Hkv, hd}), blk, ob.view({1, S, Hq, hd}),
                         lb.view({1, Hq, S}));
      if (w == 0) {
        gpu->copy(acc.flat(), ob.flat());
        gpu->copy(lse.flat(), lb.flat());
      } else {
        gpu->attention_merge(acc.view({1, S, Hq, hd}), lse.view({1, Hq, S}), ob.view({1, S, Hq, hd}),
                             lb.view({1, Hq, S}));
      }
    }
    const double e = rel_error(download(acc), ref);
    errs.push_back(e);
    std::printf("[accuracy] ring of %lld blocks: o rel err %.3e, lse rel err %.3e\n", static_cast<long long>(W), e,
                rel_error(download(lse), ref_lse));
  }
  for (double e : errs) {
    EXPECT_LT(e, 1e-2);
    EXPECT_LT(e, 1.5 * errs[0]) << "the fp32 merge must keep the error at one block's bf16 level";
  }
}

std::string write_hd64(const std::string& path) {
  std::ofstream f(path);
  f << "hidden_size: 128\nnum_hidden_layers: 2\nnum_attention_heads: 4\nnum_key_value_heads: 2\nhead_dim: 64\n"
       "intermediate_size: 200\nvocab_size: 256\nmax_position_embeddings: 4096\nrms_norm_eps: 1.0e-5\n"
       "rope_theta: 10000.0\ntie_word_embeddings: false\nbos_token_id: 1\neos_token_id: 2\n";
  return path;
}

std::vector<double> flat(const std::vector<std::vector<float>>& units) {
  std::vector<double> all;
  for (const auto& u : units) all.insert(all.end(), u.begin(), u.end());
  return all;
}

// (mode, activation.attention_head_groups)
class TwoGpus : public ::testing::TestWithParam<std::pair<SeqParallelMode, int64_t>> {};

TEST_P(TwoGpus, ModeMatchesOneGpu) {
  const SeqParallelMode mode = GetParam().first;
  const int64_t head_groups = GetParam().second;
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (size != 2) GTEST_SKIP() << "needs 2 ranks (mpirun -np 2)";
  if (ops::cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << ops::cuda_device_count();
  int argc = 0;
  char** argv = nullptr;
  dist::Runtime rt(&argc, &argv);
  uint64_t seed = test_seed();
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  const std::string path = "/tmp/easyctx-cuda-sp-" + std::to_string(seed % 1000003);
  if (rank == 0) {
    std::filesystem::create_directories(path);
    write_walk_shard(path + "/shard.h5", seed, 40, 100, 400, 256);
    write_hd64(path + "/m.yaml");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  StageConfig sp = tiny_stage(
      path + "/shard.h5", path + "/sp-" + std::to_string(static_cast<int>(mode)) + "-g" + std::to_string(head_groups));
  sp.model.config = path + "/m.yaml";
  sp.data.seq_length = 250;  // not a multiple of 2W: padded and masked
  sp.train.device = DeviceKind::Cuda;
  sp.train.seed = seed;
  sp.parallel.sequence.mode = mode;
  sp.activation.attention_head_groups = head_groups;
  sp.parallel.sequence.size = 2;
  sp.parallel.sequence.ulysses_size = mode == SeqParallelMode::Usp ? 2 : 0;
  sp.activation.checkpoint = CheckpointPolicy::AttentionOutput;
  StageConfig one = sp;
  one.parallel.sequence.size = 1;
  one.parallel.sequence.ulysses_size = 0;
  one.parallel.sequence.mode = SeqParallelMode::ZigzagRing;
  one.output.dir = path + "/one-" + std::to_string(rank);
  const dist::GroupLayout layout = dist::make_group_layout(sp, 2, rt.topology().local_size);
  dist::ProcessGroups groups(rt, layout, dist::CommBackend::Nccl, 120);
  auto self = dist::make_comm(MPI_COMM_SELF, "self", dist::CommBackend::Nccl, 120);
  train::Trainer tsp(sp, groups), tone(one, *self, *self);
  const train::StepStats a = tsp.compute_gradients(0), b = tone.compute_gradients(0);
  EXPECT_EQ(a.labels, b.labels);
  const double ge = rel_error(flat(tsp.gradients_host()), flat(tone.gradients_host()));
  std::printf("[accuracy] %s (head groups %lld) W=2 rank %d: loss %.6f vs %.6f (rel %.2e), gradients rel err %.3e\n",
              to_string(mode), static_cast<long long>(head_groups), rank, a.loss, b.loss,
              std::fabs(a.loss - b.loss) / b.loss, ge);
  EXPECT_NEAR(a.loss, b.loss, 1e-2 * b.loss);
  EXPECT_LT(ge, 3e-2);
  for (int64_t s = 0; s < 3; ++s) {
    const double la = tsp.train_step(s).loss, lb = tone.train_step(s).loss;
    EXPECT_NEAR(la, lb, 2e-2 * lb) << "step " << s;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(path);
}

INSTANTIATE_TEST_SUITE_P(Modes, TwoGpus,
                         ::testing::Values(std::make_pair(SeqParallelMode::ZigzagRing, int64_t{1}),
                                           std::make_pair(SeqParallelMode::Ulysses, int64_t{1}),
                                           std::make_pair(SeqParallelMode::DistFlash, int64_t{1}),
                                           std::make_pair(SeqParallelMode::Usp, int64_t{1}),
                                           std::make_pair(SeqParallelMode::ZigzagRing, int64_t{2})));

}  // namespace
}  // namespace easyctx::test
