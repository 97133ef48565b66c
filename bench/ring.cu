// bench_ring: zigzag ring attention forward+backward per GPU with W GPUs against one GPU at
// the same tokens per GPU (the weak-scaling efficiency of the ring), and the time the ring
// waits on communication. Causal FLOPs, FlashAttention convention: a sequence of S tokens
// costs fwd = 4 S^2 hd H / 2 and bwd = 2.5 fwd; with W GPUs each GPU owns 1/W of the
// S = W x tokens_per_gpu sequence's work. efficiency = ring TFLOP/s per GPU / one-GPU TFLOP/s.
// Run: mpirun -np W build/bin/bench_ring [--tokens 16384 32768 65536] [--reps 3]
// The timed runs order the exchanges by fences (the host never blocks). The comm column
// comes from one more fwd+bwd with comm timing on (ZigzagRingAttention::set_comm_timing:
// host-blocking exchanges, as before fences): about the exchanges' transfer time, not the
// part of it the overlapped compute failed to hide.
#include <cuda_runtime.h>

#include <functional>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "attention/zigzag_ring.h"
#include "core/config.h"
#include "core/error.h"
#include "dist/groups.h"
#include "dist/runtime.h"
#include "kernels/cuda_check.h"
#include "ops/cuda/cuda_backend.h"

using namespace easyctx;
using ops::DType;

namespace {
struct Shape {
  const char* name;
  int64_t hq, hkv, hd;
};

double seconds_of(ops::Backend& be, dist::Comm& world, int warm, int reps, const std::function<void()>& f) {
  for (int i = 0; i < warm; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    be.synchronize();
    world.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    be.synchronize();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return world.all_reduce_scalar(t[t.size() / 2], dist::ReduceOp::Max);  // the slowest rank sets the pace
}

void fill(ops::Backend& be, const ops::Buffer& b, std::mt19937_64& rng) {
  std::vector<float> h(static_cast<size_t>(b.numel()));
  std::normal_distribution<float> d(0.f, 1.f);
  for (auto& x : h) x = d(rng);
  be.copy(b.flat(), ops::Tensor(h.data(), DType::F32, {b.numel()}));
}
}  // namespace

int main(int argc, char** argv) {
  return dist::run_main(argc, argv, [&](dist::Runtime& rt) -> int {
    std::vector<int64_t> tokens = {16384, 32768, 65536};
    int reps = 3;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--tokens") {
        tokens.clear();
        while (i + 1 < argc && argv[i + 1][0] != '-') tokens.push_back(std::atoll(argv[++i]));
      } else if (a == "--reps" && i + 1 < argc) {
        reps = std::atoi(argv[++i]);
      } else {
        EASYCTX_THROW_INPUT("unknown flag ", a, " (--tokens N..., --reps R)");
      }
    }
    StageConfig cfg;
    cfg.parallel.sequence.mode = SeqParallelMode::ZigzagRing;
    cfg.parallel.sequence.size = rt.size();
    const auto layout = dist::make_group_layout(cfg, rt.size(), rt.topology().local_size);
    dist::ProcessGroups pg(rt, layout, dist::CommBackend::Nccl, 600);
    auto be = ops::make_cuda_backend();
    const int W = rt.size();
    cudaDeviceProp prop;
    EASYCTX_CUDA_CHECK(
        cudaGetDeviceProperties(&prop, rt.topology().local_rank % std::max(1, ops::cuda_device_count())));
    if (rt.rank() == 0) {
      std::printf("# bench_ring: %d x %s, zigzag ring (NCCL) vs 1 GPU, bf16, causal, fwd+bwd, median of %d\n", W,
                  prop.name, reps);
      std::printf(
          "| heads | tokens/GPU | 1 GPU TFLOP/s | ring TFLOP/s per GPU | efficiency | ring wait on comm |\n"
          "|---|---|---|---|---|---|\n");
    }
    std::mt19937_64 rng(1234 + static_cast<uint64_t>(rt.rank()));
    for (const Shape sh : {Shape{"32 x 128", 32, 32, 128}, Shape{"GQA 32/4 x 64", 32, 4, 64}}) {
      for (int64_t T : tokens) {
        T -= T % 2;
        auto q = be->alloc(DType::BF16, T * sh.hq * sh.hd), k = be->alloc(DType::BF16, T * sh.hkv * sh.hd),
             v = be->alloc(DType::BF16, T * sh.hkv * sh.hd), o = be->alloc(DType::BF16, T * sh.hq * sh.hd),
             dout = be->alloc(DType::BF16, T * sh.hq * sh.hd), lse = be->alloc(DType::F32, sh.hq * T),
             dq = be->alloc(DType::BF16, T * sh.hq * sh.hd), dk = be->alloc(DType::BF16, T * sh.hkv * sh.hd),
             dv = be->alloc(DType::BF16, T * sh.hkv * sh.hd);
        for (auto* b : {&q, &k, &v, &dout}) fill(*be, *b, rng);
        auto Q = q.view({1, T, sh.hq, sh.hd}), K = k.view({1, T, sh.hkv, sh.hd}), V = v.view({1, T, sh.hkv, sh.hd}),
             O = o.view({1, T, sh.hq, sh.hd}), DO = dout.view({1, T, sh.hq, sh.hd}), L = lse.view({1, sh.hq, T}),
             DQ = dq.view({1, T, sh.hq, sh.hd}), DK = dk.view({1, T, sh.hkv, sh.hd}),
             DV = dv.view({1, T, sh.hkv, sh.hd});
        const double scale = 1.0 / std::sqrt(static_cast<double>(sh.hd));
        const attention::AttentionTensors t{Q, K, V, O, L, scale};
        const attention::AttentionGrads g{DO, DQ, DK, DV};
        attention::LocalAttention local(*be);
        const double t1 = seconds_of(*be, pg.world(), 1, reps, [&] {
          local.forward(t);
          local.backward(t, g);
        });
        attention::ZigzagRingAttention ring(*be, pg.ring());
        const double tw = seconds_of(*be, pg.world(), 1, reps, [&] {
          ring.forward(t);
          ring.backward(t, g);
        });
        ring.set_comm_timing(true);
        ring.reset_comm_seconds();
        ring.forward(t);
        ring.backward(t, g);
        be->synchronize();
        ring.set_comm_timing(false);
        const double comm = pg.world().all_reduce_scalar(ring.comm_seconds(), dist::ReduceOp::Max);
        auto flops = [&](double S) { return 3.5 * 4.0 * S * S * static_cast<double>(sh.hd * sh.hq) / 2.0; };
        const double one = flops(static_cast<double>(T)) / t1 / 1e12;
        const double per_gpu = flops(static_cast<double>(T) * W) / W / tw / 1e12;
        if (rt.rank() == 0)
          std::printf("| %s | %lld | %.0f | %.0f | %.0f%% | %.1f ms of %.1f ms |\n", sh.name, static_cast<long long>(T),
                      one, per_gpu, 100.0 * per_gpu / one, comm * 1e3, tw * 1e3);
      }
    }
    return 0;
  });
}
