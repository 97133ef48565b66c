// The evaluations' forward-only path on the CUDA backend (label gpu; skips without a GPU):
//  - CudaEval.*: LlamaModel::forward_score in bf16 against the training forward on the same
//    backend (the NLL sum within 1e-3: the same ops, rounding of the same bf16 values) and
//    against the fp32 CPU model (2e-2), its workspace as planned; a whole session on the GPU
//    against one on the CPU (also of a dynamic-RoPE model, items longer and shorter than its
//    max_position_embeddings in turn), and its memory plan beside the measured peak.
//  - CudaEvalTwoGpus.* (mpirun -np 2, 2 GPUs, NCCL): zigzag_ring, ulysses and dist_flash over
//    two GPUs and two data-parallel GPUs against one GPU.
// head_dim 64: the CUDA attention takes head dims 64 and 128.
#include <cmath>
#include <cstdio>
#include <random>

#include "ckpt/hf_model.h"
#include "dist/comm_mpi.h"
#include "eval/eval_plan.h"
#include "eval/eval_test_util.h"
#include "eval/session.h"
#include "model/llama.h"
#include "ops/cuda/cuda_backend.h"

namespace easyctx::test {
namespace {

using ops::Buffer;
using ops::DType;
using ops::Tensor;

model::LlamaConfig hd64_config() {
  model::LlamaConfig c = llama_config("eval-hd64", {128, 2, 4, 2, 64, 200, 300});
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 4096;
  return c;
}

std::vector<std::vector<float>> random_weights(const model::LlamaConfig& cfg, uint64_t seed) {
  const model::ParamLayout layout(cfg);
  std::vector<std::vector<float>> w;
  std::vector<Tensor> v;
  for (const auto& u : layout.units()) {
    w.emplace_back(static_cast<size_t>(u.numel));
    v.emplace_back(w.back().data(), DType::F32, std::initializer_list<int64_t>{u.numel});
  }
  model::init_random(layout, v, 0.1, seed);
  return w;
}

TEST(CudaEval, ForwardScoreMatchesTheTrainingForward) {
  if (ops::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const model::LlamaConfig cfg = hd64_config();
  const auto w = random_weights(cfg, test_seed());
  auto gpu = ops::make_cuda_backend();
  auto cpu = ops::make_cpu_backend();
  model::ModelOptions mo;
  mo.checkpoint = CheckpointPolicy::Layer;
  mo.mlp_tile = 128;
  mo.lm_head_tile = 37;
  model::LlamaModel mg(cfg, *gpu, DType::BF16, mo), mc(cfg, *cpu, DType::F32, mo);
  std::vector<Buffer> pg;
  std::vector<Tensor> tg, tc;
  for (const auto& u : w) {
    const int64_t n = static_cast<int64_t>(u.size());
    pg.push_back(gpu->alloc(DType::BF16, n));
    gpu->copy(pg.back().flat(), Tensor(const_cast<float*>(u.data()), DType::F32, {n}));
    tg.push_back(pg.back().flat());
    tc.emplace_back(const_cast<float*>(u.data()), DType::F32, std::initializer_list<int64_t>{n});
  }
  std::mt19937_64 rng(test_seed());
  const int64_t n = 333;
  std::vector<int32_t> tok(n), pos(n), lab(n);
  for (int64_t i = 0; i < n; ++i) {
    tok[i] = static_cast<int32_t>(rng() % cfg.vocab_size);
    pos[i] = static_cast<int32_t>(i);
    lab[i] = (i % 11 == 4 || i + 1 == n) ? -1 : static_cast<int32_t>(rng() % cfg.vocab_size);
  }
  auto upload = [&](std::vector<int32_t>& v) {
    Buffer b = gpu->alloc(DType::I32, n);
    gpu->copy(b.flat(), Tensor(v.data(), DType::I32, {n}));
    return b;
  };
  Buffer bt = upload(tok), bp = upload(pos), bl = upload(lab);
  const model::Batch bg{bt.flat(), bp.flat(), bl.flat(), 1, n};
  const model::Batch bc{Tensor(tok.data(), DType::I32, {n}), Tensor(pos.data(), DType::I32, {n}),
                        Tensor(lab.data(), DType::I32, {n}), 1, n};
  const ops::LossSums ref = mg.forward_loss(tg, bg), ref_cpu = mc.forward_loss(tc, bc);
  mg.release_workspace();
  gpu->synchronize();
  const int64_t before = gpu->memory_stats().live_bytes;
  std::vector<double> nll(n);
  std::vector<int32_t> top(n);
  mg.forward_score(tg, bg, Tensor(nll.data(), DType::F64, {n}), Tensor(top.data(), DType::I32, {n}));
  gpu->synchronize();
  int64_t ws = 0;
  for (const auto& s : model::LlamaModel::score_workspace_specs(cfg, mo, DType::BF16, 1, n))
    ws += s.numel * static_cast<int64_t>(ops::element_size(s.dtype));
  EXPECT_EQ(gpu->memory_stats().live_bytes - before, ws) << "the workspace, the LM-head scratch freed";
  double sum = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i)
    if (lab[i] >= 0) {
      sum += nll[i];
      ++count;
    } else {
      EXPECT_EQ(nll[i], 0.0);
    }
  EXPECT_EQ(count, ref.count);
  std::printf("[accuracy] forward_score (bf16) vs forward_loss (bf16): rel %.3g; vs CPU f32: rel %.3g\n",
              std::abs(sum - ref.sum_nll) / ref.sum_nll, std::abs(sum - ref_cpu.sum_nll) / ref_cpu.sum_nll);
  EXPECT_NEAR(sum, ref.sum_nll, 1e-3 * ref.sum_nll);
  EXPECT_NEAR(sum, ref_cpu.sum_nll, 2e-2 * ref_cpu.sum_nll);
}

std::vector<eval::ScoreRequest> requests(uint64_t seed, int64_t vocab) {
  std::mt19937_64 rng(seed);
  std::vector<eval::ScoreRequest> rs(3);
  const int64_t lens[] = {517, 300, 61};
  for (size_t i = 0; i < rs.size(); ++i) {
    rs[i].tokens.resize(static_cast<size_t>(lens[i]));
    for (auto& t : rs[i].tokens) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    rs[i].spans = {{0, lens[i] - 1}, {lens[i] / 2, 5}};
  }
  return rs;
}

void expect_close(const std::vector<std::vector<eval::SpanScore>>& got,
                  const std::vector<std::vector<eval::SpanScore>>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    for (size_t s = 0; s < want[i].size(); ++s) {
      EXPECT_EQ(got[i][s].count, want[i][s].count);
      worst = std::max(worst, std::abs(got[i][s].sum_nll - want[i][s].sum_nll) / std::abs(want[i][s].sum_nll));
    }
  std::printf("[accuracy] %-40s worst span NLL rel err %.3g (tol %.0e)\n", what, worst, tol);
  EXPECT_LT(worst, tol) << what;
}

// The session on the GPU against one on the CPU; `dynamic`: a dynamic-RoPE model whose
// max_position_embeddings (64) the requests of 517 and 300 tokens pass and that of 61 does not,
// in that order: each item's frequencies uploaded for its own length, the last back to the
// default table (a table left from a longer item would change every span's NLL).
void expect_session_matches_cpu(bool dynamic) {
  uint64_t seed = 0;
  model::LlamaConfig cfg = hd64_config();
  if (dynamic) {
    cfg.max_position_embeddings = 64;
    cfg.rope_scaling.kind = model::RopeScalingKind::Dynamic;
    cfg.rope_scaling.factor = 16.0;
  }
  const std::string dir = shared_dir(dynamic ? "cuda-eval-dynamic" : "cuda-eval", seed, [&](const std::string& d) {
    auto w = random_weights(cfg, 11);
    std::vector<Tensor> v;
    for (auto& u : w)
      v.emplace_back(u.data(), DType::F32, std::initializer_list<int64_t>{static_cast<int64_t>(u.size())});
    ckpt::save_hf_model(d + "/model", cfg, model::ParamLayout(cfg), v);
  });
  const auto reqs = requests(seed, cfg.vocab_size);
  dist::MpiComm self(MPI_COMM_SELF, "self", 120);
  eval::SessionOptions o;
  o.model = dir + "/model";
  o.device = DeviceKind::Cpu;
  const auto want = eval::open_session(o, self)->score_spans(reqs);
  o.device = DeviceKind::Cuda;
  o.mlp_tile = 128;
  auto s = eval::open_session(o, self);
  expect_close(s->score_spans(reqs), want, 2e-2,
               dynamic ? "session cuda (bf16) vs cpu (f32), dynamic RoPE" : "session cuda (bf16) vs cpu (f32)");
  const plan::MemoryPlan p = eval::plan_session(o, 517, {}, 1, 1);
  const eval::SessionStats st = s->stats();
  std::printf("[memory] %s\n", plan::compare_line(p, {0, st.alloc_peak_bytes, 0}, -1, st.device_used_bytes).c_str());
  EXPECT_NEAR(static_cast<double>(st.alloc_peak_bytes), static_cast<double>(p.alloc_peak_bytes),
              0.25 * static_cast<double>(p.alloc_peak_bytes));
  std::filesystem::remove_all(dir);
}

TEST(CudaEval, SessionOnTheGpuMatchesTheCpu) {
  if (ops::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  expect_session_matches_cpu(false);
}

TEST(CudaEval, DynamicRopeSessionOnTheGpuMatchesTheCpu) {
  if (ops::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  expect_session_matches_cpu(true);
}

class CudaEvalTwoGpus : public ::testing::TestWithParam<std::pair<SeqParallelMode, int>> {};

TEST_P(CudaEvalTwoGpus, MatchesOneGpu) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) GTEST_SKIP() << "needs 2 ranks (mpirun -np 2)";
  if (ops::cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << ops::cuda_device_count();
  const auto [mode, sp] = GetParam();
  uint64_t seed = 0;
  const model::LlamaConfig cfg = hd64_config();
  const std::string dir = shared_dir("cuda-eval2", seed, [&](const std::string& d) {
    auto w = random_weights(cfg, 12);
    std::vector<Tensor> v;
    for (auto& u : w)
      v.emplace_back(u.data(), DType::F32, std::initializer_list<int64_t>{static_cast<int64_t>(u.size())});
    ckpt::save_hf_model(d + "/model", cfg, model::ParamLayout(cfg), v);
  });
  const auto reqs = requests(seed, cfg.vocab_size);
  eval::SessionOptions o;
  o.model = dir + "/model";
  o.device = DeviceKind::Cuda;
  std::vector<std::vector<eval::SpanScore>> want;
  {
    dist::MpiComm self(MPI_COMM_SELF, "self", 120);
    want = eval::open_session(o, self)->score_spans(reqs);
  }
  dist::MpiComm world(MPI_COMM_WORLD, "world", 120);
  o.sp_mode = mode;
  o.sp_size = sp;
  const auto got = eval::open_session(o, world)->score_spans(reqs);
  expect_close(got, want, sp == 1 ? 1e-6 : 1e-2, sp == 1 ? "2 data-parallel GPUs vs 1" : to_string(mode));
  MPI_Barrier(MPI_COMM_WORLD);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaEvalTwoGpus,
                         ::testing::Values(std::make_pair(SeqParallelMode::ZigzagRing, 2),
                                           std::make_pair(SeqParallelMode::Ulysses, 2),
                                           std::make_pair(SeqParallelMode::DistFlash, 2),
                                           std::make_pair(SeqParallelMode::ZigzagRing, 1)));

}  // namespace
}  // namespace easyctx::test
