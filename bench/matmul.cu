// bench_matmul: cuBLASLt at the GEMM shapes of one Llama training step, the algorithm easyctx
// runs (cuBLASLt's first heuristic, lib/ops/cuda/lt_matmul.cpp) against the fastest of the
// first --candidates heuristics, timed here. Per shape: TFLOP/s of both, and the step's matmul
// time at each (calls per step from the model's shapes: one forward, the recompute of
// `layer`/`attention_output` checkpointing, the backward).
//
//   build/bin/bench_matmul [--tokens 131072] [--hidden 4096] [--q-dim 4096] [--kv-dim 4096]
//       [--inter 11008] [--layers 32] [--mlp-tile 16384] [--vocab 32000] [--lm-tile 4096]
//       [--grad f32|bf16] [--candidates 16] [--reps 5] [--workspace-mib 32]
//
// Layout as lt_matmul.cpp: row-major C[m, n] = op(A) op(B) (A: [m, k] or, transposed, [k, m]).
//
// Read with care (bench/RESULTS.md): on H200 this bench put the fastest of 16
// candidates 1.06-1.10x ahead of the first heuristic over a step's GEMMs, but the same choice
// made inside training (timed there, on the step's own operands) took 0.7% off the 7B step's
// matmul time: there the first heuristic already ran e.g. the MLP's 16384 x 11008 x 4096 GEMM
// at 698 TFLOP/s, where this bench measured it at 618 (its best candidate 751). The bench's
// synthetic operands and back-to-back repeats are not the step's (power and clocks differ, a
// guess not measured). Its per-shape rates still rank a step's GEMMs.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_matmul: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "bench_matmul: %s: %s\n", what, cublasLtGetStatusString(s));
    std::exit(1);
  }
}

struct Shape {
  std::string name;
  int64_t m, n, k;
  bool ta, tb, c_f32;
  float beta;
  double calls;  // per step
};

__global__ void fill(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    p[i] = __float2bfloat16((static_cast<float>(h & 0xffff) / 65536.0f - 0.5f) * 0.1f);
  }
}
}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 131072, hidden = 4096, qd = 4096, kvd = 4096, inter = 11008, layers = 32, tile = 16384,
          vocab = 32000, lm_tile = 4096;
  int candidates = 16, reps = 5;
  size_t ws_bytes = size_t{32} << 20;
  bool grad_f32 = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--tokens") tokens = std::atoll(v);
    else if (a == "--hidden") hidden = std::atoll(v);
    else if (a == "--q-dim") qd = std::atoll(v);
    else if (a == "--kv-dim") kvd = std::atoll(v);
    else if (a == "--inter") inter = std::atoll(v);
    else if (a == "--layers") layers = std::atoll(v);
    else if (a == "--mlp-tile") tile = std::atoll(v);
    else if (a == "--vocab") vocab = std::atoll(v);
    else if (a == "--lm-tile") lm_tile = std::atoll(v);
    else if (a == "--grad") grad_f32 = std::string(v) == "f32";
    else if (a == "--candidates") candidates = std::atoi(v);
    else if (a == "--reps") reps = std::atoi(v);
    else if (a == "--workspace-mib") ws_bytes = static_cast<size_t>(std::atoll(v)) << 20;
    else {
      std::fprintf(stderr, "bench_matmul: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (tile <= 0 || tile > tokens) tile = tokens;
  const double L = static_cast<double>(layers), tiles = static_cast<double>(tokens) / tile;
  const double lm_tiles = static_cast<double>(tokens) / lm_tile;
  // Forward twice per layer (the forward and checkpointing's recompute), the backward once.
  std::vector<Shape> shapes = {
      {"q fwd (x2)", tokens, qd, hidden, false, true, false, 0, 2 * L},
      {"k,v fwd (x2)", tokens, kvd, hidden, false, true, false, 0, 4 * L},
      {"o fwd (x2)", tokens, hidden, qd, false, true, false, 0, 2 * L},
      {"gate,up fwd (x3)", tile, inter, hidden, false, true, false, 0, 6 * L * tiles},
      {"down fwd (x2)", tile, hidden, inter, false, true, false, 0, 2 * L * tiles},
      {"down dX", tile, inter, hidden, false, false, false, 0, L * tiles},
      {"down dW", hidden, inter, tile, true, false, grad_f32, 1, L * tiles},
      {"gate,up dX", tile, hidden, inter, false, false, false, 1, 2 * L * tiles},
      {"gate,up dW", inter, hidden, tile, true, false, grad_f32, 1, 2 * L * tiles},
      {"o dX", tokens, qd, hidden, false, false, false, 0, L},
      {"o dW", hidden, qd, tokens, true, false, grad_f32, 1, L},
      {"q dX", tokens, hidden, qd, false, false, false, 0, L},
      {"k,v dX", tokens, hidden, kvd, false, false, false, 1, 2 * L},
      {"q dW", qd, hidden, tokens, true, false, grad_f32, 1, L},
      {"k,v dW", kvd, hidden, tokens, true, false, grad_f32, 1, 2 * L},
      {"lm head fwd", lm_tile, vocab, hidden, false, true, false, 0, lm_tiles},
      {"lm head dX", lm_tile, hidden, vocab, false, false, false, 0, lm_tiles},
      {"lm head dW", vocab, hidden, lm_tile, true, false, grad_f32, 1, lm_tiles},
  };
  int64_t max_ab = 0, max_c = 0;
  for (const Shape& s : shapes) {
    max_ab = std::max({max_ab, s.m * s.k, s.k * s.n});
    max_c = std::max(max_c, s.m * s.n);
  }
  __nv_bfloat16 *a = nullptr, *b = nullptr;
  void* c = nullptr;
  void* ws = nullptr;
  check(cudaMalloc(&a, max_ab * 2), "cudaMalloc A");
  check(cudaMalloc(&b, max_ab * 2), "cudaMalloc B");
  check(cudaMalloc(&c, max_c * 4), "cudaMalloc C");
  check(cudaMemset(c, 0, max_c * 4), "cudaMemset C");
  if (ws_bytes) check(cudaMalloc(&ws, ws_bytes), "cudaMalloc workspace");
  fill<<<1024, 256>>>(a, max_ab, 1u);
  fill<<<1024, 256>>>(b, max_ab, 2u);
  check(cudaDeviceSynchronize(), "fill");
  cublasLtHandle_t lt;
  check(cublasLtCreate(&lt), "cublasLtCreate");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device properties");
  std::printf(
      "device %s; tokens %lld hidden %lld q %lld kv %lld inter %lld layers %lld mlp_tile %lld vocab %lld "
      "lm_tile %lld, gradients %s, workspace %zu MiB, %d candidates, %d reps\n",
      prop.name, (long long)tokens, (long long)hidden, (long long)qd, (long long)kvd, (long long)inter,
      (long long)layers, (long long)tile, (long long)vocab, (long long)lm_tile, grad_f32 ? "f32" : "bf16",
      ws_bytes >> 20, candidates, reps);
  std::printf("%-18s %8s %7s %7s %5s %9s %9s %5s %10s %10s\n", "gemm", "m", "n", "k", "C", "heur0", "best", "idx",
              "step heur0", "step best");
  double step0 = 0, step_best = 0;
  for (const Shape& s : shapes) {
    cublasLtMatmulDesc_t desc;
    check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    const cublasOperation_t op_a = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), "transa");
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), "transb");
    const uint64_t b_rows = s.tb ? s.n : s.k, b_cols = s.tb ? s.k : s.n;
    const uint64_t a_rows = s.ta ? s.k : s.m, a_cols = s.ta ? s.m : s.k;
    const cudaDataType_t ct = s.c_f32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasLtMatrixLayout_t la, lb, lc;
    check(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, b_cols, b_rows, b_cols), "layout A");
    check(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, a_cols, a_rows, a_cols), "layout B");
    check(cublasLtMatrixLayoutCreate(&lc, ct, s.n, s.m, s.n), "layout C");
    cublasLtMatmulPreference_t pref;
    check(cublasLtMatmulPreferenceCreate(&pref), "preference");
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                               sizeof(ws_bytes)),
          "workspace preference");
    std::vector<cublasLtMatmulHeuristicResult_t> res(candidates);
    int found = 0;
    check(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, candidates, res.data(), &found), "heuristic");
    const float alpha = 1.0f, beta = s.beta;
    std::vector<double> ms(found, 1e30);
    for (int i = 0; i < found; ++i) {
      if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
      auto run = [&] {
        return cublasLtMatmul(lt, desc, &alpha, b, la, a, lb, &beta, c, lc, c, lc, &res[i].algo, ws, ws_bytes, 0);
      };
      if (run() != CUBLAS_STATUS_SUCCESS) continue;
      check(cudaDeviceSynchronize(), "warm-up");
      check(cudaEventRecord(e0), "record");
      for (int r = 0; r < reps; ++r) check(run(), "matmul");
      check(cudaEventRecord(e1), "record");
      check(cudaEventSynchronize(e1), "sync");
      float t = 0;
      check(cudaEventElapsedTime(&t, e0, e1), "elapsed");
      ms[i] = t / reps;
    }
    const int best = static_cast<int>(std::min_element(ms.begin(), ms.end()) - ms.begin());
    const double flop = 2.0 * s.m * s.n * s.k;
    std::printf("%-18s %8lld %7lld %7lld %5s %9.1f %9.1f %5d %9.1fms %9.1fms\n", s.name.c_str(), (long long)s.m,
                (long long)s.n, (long long)s.k, s.c_f32 ? "f32" : "bf16", flop / ms[0] * 1e-9, flop / ms[best] * 1e-9,
                best, ms[0] * s.calls, ms[best] * s.calls);
    step0 += ms[0] * s.calls;
    step_best += ms[best] * s.calls;
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
  }
  std::printf("step matmuls: heuristic 0 %.1f ms, best of candidates %.1f ms (%.3fx)\n", step0, step_best,
              step0 / step_best);
  return 0;
}
