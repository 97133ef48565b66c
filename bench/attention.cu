// Attention kernel benchmark: forward and backward TFLOP/s of the CUDA backend's attention
// (bf16, causal, batch 1) at several sequence lengths, for 32 heads x 128 (MHA) and GQA
// 32/4 x 64. FLOPs use the FlashAttention convention with causal halving:
//   fwd = 4 S^2 hd H / 2,  bwd = 2.5 fwd  (the kernel itself does 3.5x fwd: see docs/cuda.md)
// Timing: CUDA events on the backend's stream, warm-up first, median of the repeats.
// A second table times blocks without a mask (a ring's off-diagonal steps, FLOPs 4 S^2 hd H)
// on both paths: our kernels and cuDNN's fused SDPA (ops::CudaBackendOptions::cudnn_attention).
// A third table, on sm_90 devices only, times the Hopper forward kernel (attention_fwd_sm90,
// which the backend's route runs on sm_90: lib/ops/attention_route.h), each variant, on the same
// shapes, causal and unmasked, beside cuDNN's forward (the backend with sm90_attention off)
// timed on the same inputs in the same process, with the max abs difference of its o from the
// backend's at the first causal length (a sanity check).
// --sm90-only skips the first two tables (the cuDNN column of the third is still timed).
// A fourth table, on sm_90 only, times the Hopper backward (attention_bwd_sm90, each variant:
// atomic and deterministic split dQ) beside the backend's backward (cuDNN, sm90_attention off)
// on the same inputs (o and lse from the backend's forward), FLOPs 2.5 x the forward's, with the
// max abs difference of its dq/dk/dv from the backend's at the first causal length.
// --sm90-bwd-only prints only that table.
// Output: markdown tables on stdout (bench/run_attention.sh puts them beside torch's).
#include <boost/program_options.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attention_sm90.h"
#include "kernels/cuda_check.h"
#include "ops/cuda/cuda_attention.h"
#include "ops/cuda/cuda_backend.h"

namespace po = boost::program_options;
using namespace easyctx;
using ops::DType;

namespace {

struct Shape {
  const char* name;
  int64_t hq, hkv, hd;
};

// max |a - b| over the first n elements of two device buffers (infinity where either is NaN).
double max_abs_diff(ops::Backend& be, const ops::Buffer& a, const ops::Buffer& b, int64_t n) {
  std::vector<float> h1(static_cast<size_t>(n)), h2(static_cast<size_t>(n));
  be.copy(ops::Tensor(h1.data(), DType::F32, {n}), a.flat());
  be.copy(ops::Tensor(h2.data(), DType::F32, {n}), b.flat());
  double e = 0;
  for (size_t i = 0; i < h1.size(); ++i) {
    const double d = std::abs(static_cast<double>(h1[i]) - h2[i]);
    e = std::isnan(d) ? INFINITY : std::max(e, d);
  }
  return e;
}

// Prints the table row of a shape the kernel does not run (`supported` false, `why` the
// reason); returns whether it was refused.
bool refused(bool supported, const Shape& s, int64_t S, bool causal, const std::string& why) {
  if (supported) return false;
  std::printf("| %s | %lld | %s | - | - | unsupported: %s |\n", s.name, static_cast<long long>(S),
              causal ? "causal" : "none", why.c_str());
  return true;
}

// Untimed and timed runs at sequence length S: fewer from 128K on, where one call takes long.
std::pair<int, int> runs_at(int64_t S, int reps) {
  return S >= 131072 ? std::pair<int, int>{1, std::max(3, reps / 2)} : std::pair<int, int>{3, reps};
}

// Median of `reps` timings (ms) of f, after `warm` untimed runs.
template <typename F>
double time_ms(ops::Backend& be, int warm, int reps, F&& f) {
  cudaStream_t st = ops::cuda_stream(be);
  for (int i = 0; i < warm; ++i) f();
  std::vector<double> ms;
  cudaEvent_t a, b;
  EASYCTX_CUDA_CHECK(cudaEventCreate(&a));
  EASYCTX_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < reps; ++i) {
    EASYCTX_CUDA_CHECK(cudaEventRecord(a, st));
    f();
    EASYCTX_CUDA_CHECK(cudaEventRecord(b, st));
    EASYCTX_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    EASYCTX_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void fill_random(ops::Backend& be, const ops::Buffer& buf, std::mt19937_64& rng) {
  std::vector<float> h(static_cast<size_t>(buf.numel()));
  std::normal_distribution<float> d(0.f, 1.f);
  for (auto& x : h) x = d(rng);
  be.copy(buf.flat(), ops::Tensor(h.data(), DType::F32, {buf.numel()}));
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<int64_t> seqs, full_seqs;
  int reps = 5;
  bool deterministic = true;
  int64_t bwd_tile = 0;
  bool causal_graph = true;
  bool sm90_only = false;
  bool sm90_bwd_only = false;
  bool hopper = true;
  std::vector<std::string> sm90_variants;
  po::options_description desc("bench_attention: attention fwd/bwd TFLOP/s of the CUDA backend");
  desc.add_options()("help", "this help")(
      "seq",
      po::value<std::vector<int64_t>>(&seqs)->multitoken()->default_value({8192, 32768, 131072}, "8192 32768 131072"),
      "sequence lengths (causal)")(
      "full-seq", po::value<std::vector<int64_t>>(&full_seqs)->multitoken()->default_value({8192, 32768}, "8192 32768"),
      "sequence lengths of the blocks without a mask")("reps", po::value<int>(&reps)->default_value(5),
                                                       "timed repeats (median)")(
      "deterministic", po::value<bool>(&deterministic)->default_value(true),
      "cuDNN backward: deterministic graph (train.deterministic) or atomic dQ")(
      "bwd-tile", po::value<int64_t>(&bwd_tile)->default_value(0), "backward tile (0: the backend's default)")(
      "causal-graph", po::value<bool>(&causal_graph)->default_value(true),
      "causal squares' forward through cuDNN's causal graph (false: query chunks)")(
      "hopper", po::value<bool>(&hopper)->default_value(true),
      "the first two tables' backend routes the forward through the Hopper kernel where the router does "
      "(train.hopper_attention; sm_90 only)")("sm90-only", po::bool_switch(&sm90_only),
                                              "only the sm90 forward kernel's table (skip the backend's fwd/bwd "
                                              "tables; cuDNN's forward is still timed for its column)")(
      "sm90-bwd-only", po::bool_switch(&sm90_bwd_only),
      "only the sm90 backward kernel's table (cuDNN's backward is still timed for its column)")(
      "sm90-variant", po::value<std::vector<std::string>>(&sm90_variants)->multitoken(),
      "sm90 forward / backward variants to time (names as printed; default: every one)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  po::notify(vm);
  if (sm90_bwd_only) sm90_only = true;
  // --sm90-variant: the variants asked for by name (all when none is named).
  const auto wanted = [&](const char* name) {
    return sm90_variants.empty() || std::find(sm90_variants.begin(), sm90_variants.end(), name) != sm90_variants.end();
  };
  if (ops::cuda_device_count() == 0) {
    std::cerr << "bench_attention: no CUDA device\n";
    return 77;
  }
  cudaDeviceProp prop{};
  EASYCTX_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  ops::CudaBackendOptions bopts;
  bopts.deterministic = deterministic;
  bopts.attention_bwd_tile = bwd_tile;
  bopts.cudnn_causal_graph = causal_graph;
  bopts.sm90_attention = hopper;
  auto be = ops::make_cuda_backend(bopts);
  std::mt19937_64 rng(1234);
  const Shape shapes[] = {{"32x128 MHA", 32, 32, 128}, {"GQA 32/4 x64", 32, 4, 64}};
  std::printf("# easyctx attention (%s), bf16, causal, batch 1, backward %s, tile %lld\n\n", prop.name,
              deterministic ? "deterministic" : "atomic dQ",
              static_cast<long long>(ops::attention_bwd_tile(deterministic, bwd_tile)));
  std::printf(
      "| shape | seq | fwd ms | fwd TFLOP/s | fwd path | bwd ms | bwd TFLOP/s | bwd path |\n"
      "|---|---|---|---|---|---|---|---|\n");
  struct Row {
    double fwd_ms, bwd_ms;
    std::string fwd_path, path;
  };
  // Times one block shape on backend `be`; causal counts half the FLOPs.
  auto run = [&](ops::Backend& be, const Shape& s, int64_t S, bool causal) {
    const int64_t nq = S * s.hq * s.hd, nk = S * s.hkv * s.hd;
    ops::Buffer q = be.alloc(DType::BF16, nq), k = be.alloc(DType::BF16, nk), v = be.alloc(DType::BF16, nk);
    ops::Buffer o = be.alloc(DType::BF16, nq), lse = be.alloc(DType::F32, s.hq * S);
    ops::Buffer dout = be.alloc(DType::BF16, nq), dq = be.alloc(DType::BF16, nq), dk = be.alloc(DType::BF16, nk),
                dv = be.alloc(DType::BF16, nk);
    for (const ops::Buffer* b : {&q, &k, &v, &dout}) fill_random(be, *b, rng);
    const auto qv = [&](const ops::Buffer& b) { return b.view({1, S, s.hq, s.hd}); };
    const auto kv = [&](const ops::Buffer& b) { return b.view({1, S, s.hkv, s.hd}); };
    ops::AttentionBlock blk;
    blk.scale = 1.0 / std::sqrt(static_cast<double>(s.hd));
    blk.causal = causal;
    blk.accumulate = !causal;  // a causal square: one GPU's sequence (LocalAttention overwrites); full: a ring step
    const auto [warm, r] = runs_at(S, reps);
    Row row;
    row.fwd_ms = time_ms(be, warm, r, [&] { be.attention_fwd(qv(q), kv(k), kv(v), blk, qv(o), lse.flat()); });
    row.fwd_path = ops::cuda_attention_path(be);
    row.bwd_ms = time_ms(be, warm, r, [&] {
      be.attention_bwd(qv(q), kv(k), kv(v), qv(o), lse.flat(), qv(dout), blk, qv(dq), kv(dk), kv(dv));
    });
    row.path = ops::cuda_attention_path(be);
    return row;
  };
  auto flops = [](const Shape& s, int64_t S, bool causal) {
    return 4.0 * double(S) * double(S) * double(s.hd) * double(s.hq) / (causal ? 2 : 1);
  };
  for (const Shape& s : shapes) {
    for (int64_t S : seqs) {
      if (sm90_only) break;
      const Row r = run(*be, s, S, true);
      const double fl = flops(s, S, true);
      std::printf("| %s | %lld | %.2f | %.0f | %s | %.2f | %.0f | %s |\n", s.name, static_cast<long long>(S), r.fwd_ms,
                  fl / r.fwd_ms / 1e9, r.fwd_path.c_str(), r.bwd_ms, 2.5 * fl / r.bwd_ms / 1e9, r.path.c_str());
      std::fflush(stdout);
    }
  }
  ops::CudaBackendOptions kopts = bopts;
  kopts.cudnn_attention = false;
  auto kern = ops::make_cuda_backend(kopts);
  std::printf("\n# blocks without a mask (ring off-diagonal steps), bf16, batch 1, FLOPs 4 S^2 hd H\n\n");
  std::printf("| shape | S | path | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s |\n|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    for (int64_t S : full_seqs) {
      if (sm90_only) break;
      for (ops::Backend* b : {kern.get(), be.get()}) {
        const Row r = run(*b, s, S, false);
        const double fl = flops(s, S, false);
        std::printf("| %s | %lld | %s | %.2f | %.0f | %.2f | %.0f |\n", s.name, static_cast<long long>(S),
                    r.path.c_str(), r.fwd_ms, fl / r.fwd_ms / 1e9, r.bwd_ms, 2.5 * fl / r.bwd_ms / 1e9);
        std::fflush(stdout);
      }
    }
  }

  // The Hopper forward kernel, called directly (same AttentionParams as the backend builds).
  if (!kernels::sm90_device_available()) {
    std::printf("\n# sm90 forward kernel: skipped (device is not sm_90)\n");
    return 0;
  }
  // The comparison backend: cuDNN's forward (the router's route without the Hopper kernel).
  ops::CudaBackendOptions copts = bopts;
  copts.sm90_attention = false;
  auto cud = ops::make_cuda_backend(copts);
  std::printf(
      "\n# sm90 forward kernel (kernels/attention_sm90.h), bf16, batch 1, every variant; cudnn = the backend's forward "
      "on the "
      "same inputs in this process (causal: cuDNN's causal graph, none: cuDNN SDPA; its path in brackets); max |o - "
      "backend o| "
      "at the first causal length\n\n");
  std::printf(
      "| shape | S | mask | variant | fwd ms | fwd TFLOP/s | cudnn fwd TFLOP/s | ours / cudnn | max abs diff vs "
      "backend |\n"
      "|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    if (sm90_bwd_only) break;
    bool first = true;
    for (const bool causal : {true, false}) {
      for (const int64_t S : causal ? seqs : full_seqs) {
        const int64_t nq = S * s.hq * s.hd, nk = S * s.hkv * s.hd;
        ops::Buffer q = cud->alloc(DType::BF16, nq), k = cud->alloc(DType::BF16, nk), v = cud->alloc(DType::BF16, nk);
        ops::Buffer o = cud->alloc(DType::BF16, nq), lse = cud->alloc(DType::F32, s.hq * S);
        for (const ops::Buffer* b : {&q, &k, &v}) fill_random(*cud, *b, rng);
        ops::AttentionBlock blk;
        blk.scale = 1.0 / std::sqrt(static_cast<double>(s.hd));
        blk.causal = causal;
        kernels::AttentionParams p =
            ops::cuda::attention_params("bench_attention", q.view({1, S, s.hq, s.hd}), k.view({1, S, s.hkv, s.hd}),
                                        v.view({1, S, s.hkv, s.hd}), blk);
        p.o_out = static_cast<__nv_bfloat16*>(o.data());
        p.lse_out = static_cast<float*>(lse.data());
        std::string why;
        if (refused(kernels::attention_fwd_sm90_supported(p, &why), s, S, causal, why)) continue;
        cudaStream_t st = ops::cuda_stream(*cud);
        const auto [warm, r] = runs_at(S, reps);
        const bool check = first && causal;
        first = false;
        // The backend's forward on the same inputs: the comparison column (timed here, same
        // process and inputs) and, at the first causal length, the reference o.
        ops::Buffer o2 = cud->alloc(DType::BF16, nq), lse2 = cud->alloc(DType::F32, s.hq * S);
        const double cudnn_ms = time_ms(*cud, warm, r, [&] {
          cud->attention_fwd(q.view({1, S, s.hq, s.hd}), k.view({1, S, s.hkv, s.hd}), v.view({1, S, s.hkv, s.hd}), blk,
                             o2.view({1, S, s.hq, s.hd}), lse2.flat());
        });
        const std::string cudnn_path = ops::cuda_attention_path(*cud);
        const double cudnn_tf = flops(s, S, causal) / cudnn_ms / 1e9;
        for (const auto var : kernels::sm90_fwd_variants()) {
          if (!kernels::sm90_fwd_variant_supported(var, s.hd)) continue;
          if (!wanted(kernels::sm90_fwd_variant_name(var))) continue;
          const double ms = time_ms(*cud, warm, r, [&] { kernels::attention_fwd_sm90(p, st, var); });
          const std::string hang = kernels::sm90_take_hang_report();
          if (!hang.empty()) {
            std::printf("| %s | %lld | %s | %s | hung: %s |\n", s.name, static_cast<long long>(S),
                        causal ? "causal" : "none", kernels::sm90_fwd_variant_name(var), hang.c_str());
            continue;
          }
          std::string diff = "-";
          if (check) {
            std::ostringstream os;
            os << max_abs_diff(*cud, o, o2, nq);
            diff = os.str();
          }
          const double tf = flops(s, S, causal) / ms / 1e9;
          std::printf("| %s | %lld | %s | %s | %.2f | %.0f | %.0f (%s) | %.3f | %s |\n", s.name,
                      static_cast<long long>(S), causal ? "causal" : "none", kernels::sm90_fwd_variant_name(var), ms,
                      tf, cudnn_tf, cudnn_path.c_str(), tf / cudnn_tf, diff.c_str());
          std::fflush(stdout);
        }
      }
    }
  }

  // The Hopper backward kernel, called directly, beside the backend's (cuDNN) backward.
  std::printf(
      "\n# sm90 backward kernel (kernels/attention_sm90.h: attention_bwd_sm90), bf16, batch 1, each variant; FLOPs 2.5 "
      "x "
      "fwd; cudnn = the backend's backward in the same mode (sm90_attention off; atomic: train.deterministic false, "
      "one "
      "call; deterministic: cuDNN's deterministic graph in its tiles; causal squares overwrite the gradients, unmasked "
      "blocks accumulate, as LocalAttention / a ring step call it) on the same inputs; o and lse from the backend's "
      "forward; max |d - backend d| over dq, dk, dv at the first causal length\n\n");
  ops::CudaBackendOptions copts_atomic = copts;
  copts_atomic.deterministic = false;
  copts.deterministic = true;
  auto cud_atomic = ops::make_cuda_backend(copts_atomic), cud_det = ops::make_cuda_backend(copts);
  std::printf(
      "| shape | S | mask | variant | bwd ms | bwd TFLOP/s | cudnn bwd TFLOP/s | ours / cudnn | max abs diff vs "
      "backend |\n"
      "|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    bool first = true;
    for (const bool causal : {true, false}) {
      for (const int64_t S : causal ? seqs : full_seqs) {
        const int64_t nq = S * s.hq * s.hd, nk = S * s.hkv * s.hd;
        ops::Buffer q = cud->alloc(DType::BF16, nq), k = cud->alloc(DType::BF16, nk), v = cud->alloc(DType::BF16, nk);
        ops::Buffer o = cud->alloc(DType::BF16, nq), lse = cud->alloc(DType::F32, s.hq * S),
                    dout = cud->alloc(DType::BF16, nq);
        ops::Buffer dq = cud->alloc(DType::BF16, nq), dk = cud->alloc(DType::BF16, nk),
                    dv = cud->alloc(DType::BF16, nk);
        ops::Buffer dq2 = cud->alloc(DType::BF16, nq), dk2 = cud->alloc(DType::BF16, nk),
                    dv2 = cud->alloc(DType::BF16, nk);
        for (const ops::Buffer* b : {&q, &k, &v, &dout}) fill_random(*cud, *b, rng);
        for (const ops::Buffer* b : {&dq, &dk, &dv, &dq2, &dk2, &dv2}) cud->fill(b->flat(), 0.0);
        const auto qv = [&](const ops::Buffer& b) { return b.view({1, S, s.hq, s.hd}); };
        const auto kv = [&](const ops::Buffer& b) { return b.view({1, S, s.hkv, s.hd}); };
        ops::AttentionBlock blk;
        blk.scale = 1.0 / std::sqrt(static_cast<double>(s.hd));
        blk.causal = causal;
        blk.accumulate = !causal;
        cud->attention_fwd(qv(q), kv(k), kv(v), blk, qv(o), lse.flat());
        kernels::AttentionParams p = ops::cuda::attention_params("bench_attention", qv(q), kv(k), kv(v), blk);
        p.o = static_cast<const __nv_bfloat16*>(o.data());
        p.dout = static_cast<const __nv_bfloat16*>(dout.data());
        p.lse = static_cast<const float*>(lse.data());
        p.dq = static_cast<__nv_bfloat16*>(dq2.data());
        p.dk = static_cast<__nv_bfloat16*>(dk2.data());
        p.dv = static_cast<__nv_bfloat16*>(dv2.data());
        std::string why;
        if (refused(kernels::attention_bwd_sm90_supported(p, &why), s, S, causal, why)) continue;
        const int64_t scratch_bytes = kernels::attention_bwd_sm90_scratch_bytes(p);
        ops::Buffer scr = cud->alloc(DType::F32, scratch_bytes / 4 + 64);
        void* scratch = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(scr.data()) + 255) / 256 * 256);
        cudaStream_t st = ops::cuda_stream(*cud);
        const auto [warm, r] = runs_at(S, reps);
        const bool check = first && causal;
        first = false;
        const double fl = 2.5 * flops(s, S, causal);
        double cudnn_ms_of[2] = {0, 0};  // timed once per mode (atomic, deterministic)
        for (const auto var : kernels::sm90_bwd_variants()) {
          if (!kernels::sm90_bwd_variant_supported(var, s.hd)) continue;
          if (!wanted(kernels::sm90_bwd_variant_name(var))) continue;
          const bool det = kernels::sm90_bwd_variant_deterministic(var);
          ops::Backend& cb = det ? *cud_det : *cud_atomic;
          if (cudnn_ms_of[det] == 0 || check)
            cudnn_ms_of[det] = time_ms(cb, warm, r, [&] {
              cb.attention_bwd(qv(q), kv(k), kv(v), qv(o), lse.flat(), qv(dout), blk, qv(dq), kv(dk), kv(dv));
            });
          const double cudnn_ms = cudnn_ms_of[det];
          const std::string cudnn_path = ops::cuda_attention_path(cb);
          const double cudnn_tf = fl / cudnn_ms / 1e9;
          std::string diff = "-";
          if (check) {  // one call onto zeroed gradients, against the backend's (which overwrote them)
            for (const ops::Buffer* b : {&dq2, &dk2, &dv2}) cud->fill(b->flat(), 0.0);
            kernels::attention_bwd_sm90(p, scratch, st, var);
            const double e = std::max(
                {max_abs_diff(*cud, dq, dq2, nq), max_abs_diff(*cud, dk, dk2, nk), max_abs_diff(*cud, dv, dv2, nk)});
            std::ostringstream os;
            os << e;
            diff = os.str();
          }
          const double ms = time_ms(*cud, warm, r, [&] { kernels::attention_bwd_sm90(p, scratch, st, var); });
          const std::string hang = kernels::sm90_bwd_take_hang_report();
          if (!hang.empty()) {
            std::printf("| %s | %lld | %s | %s | hung: %s |\n", s.name, static_cast<long long>(S),
                        causal ? "causal" : "none", kernels::sm90_bwd_variant_name(var), hang.c_str());
            continue;
          }
          const double tf = fl / ms / 1e9;
          std::printf("| %s | %lld | %s | %s | %.2f | %.0f | %.0f (%s) | %.3f | %s |\n", s.name,
                      static_cast<long long>(S), causal ? "causal" : "none", kernels::sm90_bwd_variant_name(var), ms,
                      tf, cudnn_tf, cudnn_path.c_str(), tf / cudnn_tf, diff.c_str());
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "bench_attention: " << e.what() << "\n";
  return 1;
}
