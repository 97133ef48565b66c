// The Hopper attention backward (kernels/attention_sm90.h: attention_bwd_sm90) against the CPU
// backend's attention_bwd on the same bf16-rounded inputs. First the GEMM shapes / layouts the
// backward adds, on one block (sm90_bwd_tile_check: S^T = K Q^T at m64n64, dK-style bf16(S^T) Q
// with a 64-row MN-major B, dQ-style bf16(S^T)^T K through swizzled shared memory with both
// operands MN-major), so a failure names the layer at fault; then the backward at odd shapes
// (ragged tiles, Sq != Sk with diagonal offsets incl. negative ones and rows that see no key,
// non-causal, batch 2, GQA 32/4 x 64 and 8/2 x 128, strided views, more CTAs than SMs), each
// variant (atomic and deterministic split dQ; the deterministic one twice: bit-identical). The
// gradients start from small random values (the contract is +=): the increments are compared, and writes into the
// padding between rows / batches are caught. Every case prints its errors. Skips without an
// sm_90 device (the kernel is sm_90a code only).
#include <algorithm>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "sm90_test_util.h"

namespace easyctx::test {
namespace {

// Line-buffered stdout: if a case hangs and the run is killed, the earlier lines reach the log.
const bool kLineBuffered = [] { return std::setvbuf(stdout, nullptr, _IOLBF, 0) == 0; }();

using CudaAttentionSm90Bwd = CudaAttentionSm90Test;

// One block through the backward's new GEMM layer (see sm90_bwd_tile_check in attention_sm90.h).
// dk and dq are checked against bf16(S^T as the GPU computed it), so an error in S^T alone does
// not show up in them.
TEST_F(CudaAttentionSm90Bwd, GemmTileMatchesHostGemm) {
  for (int hd : {128, 64}) {
    tag = "hd" + std::to_string(hd);
    const DType t = DType::BF16;
    auto q = rand(64 * hd, t), k = rand(128 * hd, t);
    Buffer bq = upload(q, t), bk = upload(k, t), bs = gpu->alloc(DType::F32, 128 * 64),
           bdk = gpu->alloc(DType::F32, 128 * hd), bdq = gpu->alloc(DType::F32, 64 * hd);
    poison(bs);
    poison(bdk);
    gpu->synchronize();
    kernels::sm90_bwd_tile_check(bf(bq), bf(bk), hd, static_cast<float*>(bs.data()), static_cast<float*>(bdk.data()),
                                 static_cast<float*>(bdq.data()), ops::cuda_stream(*gpu));
    gpu->synchronize();
    const std::string hang = kernels::sm90_bwd_take_hang_report();
    EXPECT_EQ(hang, "") << "hd " << hd << ": the TMA loads never completed their mbarrier";
    const auto gs = download(bs), gdk = download(bdk), gdq = download(bdq);
    std::vector<float> rs(128 * 64), rdk(128 * static_cast<size_t>(hd)), rdq(64 * static_cast<size_t>(hd));
    for (int j = 0; j < 128; ++j)
      for (int i = 0; i < 64; ++i) {
        double acc = 0;
        for (int d = 0; d < hd; ++d) acc += static_cast<double>(k[j * hd + d]) * q[i * hd + d];
        rs[j * 64 + i] = static_cast<float>(acc);
      }
    const auto ps = rounded(gs, t);  // bf16(S^T) as the GPU rounded it
    for (int j = 0; j < 128; ++j)
      for (int c = 0; c < hd; ++c) {
        double acc = 0;
        for (int i = 0; i < 64; ++i) acc += static_cast<double>(ps[j * 64 + i]) * q[i * hd + c];
        rdk[j * hd + c] = static_cast<float>(acc);
      }
    for (int i = 0; i < 64; ++i)
      for (int c = 0; c < hd; ++c) {
        double acc = 0;
        for (int j = 0; j < 128; ++j) acc += static_cast<double>(ps[j * 64 + i]) * k[j * hd + c];
        rdq[i * hd + c] = static_cast<float>(acc);
      }
    std::printf("[tile] hd %d: S^T = K Q^T max abs err %.3g, dK-style bf16(S^T) Q %.3g, dQ-style bf16(S^T)^T K %.3g\n",
                hd, max_abs(gs, rs), max_abs(gdk, rdk), max_abs(gdq, rdq));
    const int64_t bad_s = report_mismatches("S^T (m64n64k16, K-major A and B)", gs, rs, 64, 1e-3, 1e-4);
    const int64_t bad_k =
        report_mismatches("dK-style (register A, 64-row MN-major B, LBO 8 KiB)", gdk, rdk, hd, 1e-3, 1e-4);
    const int64_t bad_q =
        report_mismatches("dQ-style (swizzled st.shared of dS^T, trans-a / trans-b ss)", gdq, rdq, hd, 1e-3, 1e-4);
    EXPECT_EQ(bad_s, 0) << "hd " << hd << ": the S^T GEMM tile is wrong";
    EXPECT_EQ(bad_k, 0) << "hd " << hd << ": the dK/dV-style GEMM tile is wrong";
    EXPECT_EQ(bad_q, 0) << "hd " << hd << ": the dQ-style GEMM tile is wrong";
  }
}

class CudaAttentionSm90BwdShapes : public CudaAttentionSm90Bwd, public ::testing::WithParamInterface<Case> {};

// The variants to run: all by default (each where it supports the head dim);
// EASYCTX_SM90_BWD_VARIANT=<name> (sm90_bwd_variant_name) picks one.
std::vector<kernels::Sm90BwdVariant> bwd_variants() {
  const char* e = std::getenv("EASYCTX_SM90_BWD_VARIANT");
  const std::string v = e ? e : "";
  for (const auto x : kernels::sm90_bwd_variants())
    if (v == kernels::sm90_bwd_variant_name(x)) return {x};
  return kernels::sm90_bwd_variants();
}

TEST_P(CudaAttentionSm90BwdShapes, BackwardMatchesReference) {
  const Case c = GetParam();
  const DType t = DType::BF16;
  const int64_t nq = c.b * c.sq * c.hq * c.hd, nk = c.b * c.sk * c.hkv * c.hd, nl = c.b * c.hq * c.sq;
  auto q = rand(nq, t, -2, 2), k = rand(nk, t, -2, 2), v = rand(nk, t);
  ops::AttentionBlock blk;
  blk.scale = 1.0 / std::sqrt(static_cast<double>(c.hd));
  blk.causal = c.causal;
  blk.q_offset = c.diag;
  blk.k_offset = 0;
  std::vector<float> o(static_cast<size_t>(nq)), l(static_cast<size_t>(nl));
  cpu->attention_fwd(host(q, {c.b, c.sq, c.hq, c.hd}), host(k, {c.b, c.sk, c.hkv, c.hd}),
                     host(v, {c.b, c.sk, c.hkv, c.hd}), blk, host(o, {c.b, c.sq, c.hq, c.hd}), host(l, {nl}));
  // The backward from the reference's o (rounded) and lse onto small random starting values.
  auto orr = rounded(o, t), dout = rand(nq, t), dq0 = rand(nq, t, -0.05, 0.05), dk0 = rand(nk, t, -0.05, 0.05),
       dv0 = rand(nk, t, -0.05, 0.05);
  auto dq = dq0, dk = dk0, dv = dv0;
  cpu->attention_bwd(host(q, {c.b, c.sq, c.hq, c.hd}), host(k, {c.b, c.sk, c.hkv, c.hd}),
                     host(v, {c.b, c.sk, c.hkv, c.hd}), host(orr, {c.b, c.sq, c.hq, c.hd}), host(l, {nl}),
                     host(dout, {c.b, c.sq, c.hq, c.hd}), blk, host(dq, {c.b, c.sq, c.hq, c.hd}),
                     host(dk, {c.b, c.sk, c.hkv, c.hd}), host(dv, {c.b, c.sk, c.hkv, c.hd}));

  // Device layout: rows of H*hd elements plus c.pad, batches of S rows plus 4*c.pad, the
  // padding NaN (reading it would show up in the gradients, writing it is counted below).
  const int64_t q_row = c.hq * c.hd + c.pad, q_batch = c.sq * q_row + 4 * c.pad, k_row = c.hkv * c.hd + c.pad,
                k_batch = c.sk * k_row + 4 * c.pad;
  const auto spread = [&](const std::vector<float>& x, int64_t rows, int64_t width, int64_t row, int64_t batch) {
    return spread_rows(x, c.b, rows, width, row, batch);
  };
  const auto gather = [&](const std::vector<float>& d, int64_t rows, int64_t width, int64_t row, int64_t batch,
                          int64_t* pad_written) { return gather_rows(d, c.b, rows, width, row, batch, pad_written); };
  auto sq_ = [&](const std::vector<float>& x) { return upload(spread(x, c.sq, c.hq * c.hd, q_row, q_batch), t); };
  auto sk_ = [&](const std::vector<float>& x) { return upload(spread(x, c.sk, c.hkv * c.hd, k_row, k_batch), t); };
  Buffer bq = sq_(q), bk = sk_(k), bv = sk_(v), bo = sq_(orr), bdo = sq_(dout), bl = upload(l, DType::F32);

  kernels::AttentionParams p = case_params(c, blk.scale, q_row, q_batch, k_row, k_batch);
  p.q = bf(bq);
  p.k = bf(bk);
  p.v = bf(bv);
  p.o = bf(bo);
  p.dout = bf(bdo);
  p.lse = static_cast<const float*>(bl.data());
  // Scratch from the caller, 256-byte aligned; poisoned (NaN bytes) so nothing may rely on it.
  const int64_t scratch_bytes = kernels::attention_bwd_sm90_scratch_bytes(p);
  ASSERT_GT(scratch_bytes, 0);
  Buffer bscr = gpu->alloc(DType::F32, scratch_bytes / 4 + 64);
  poison(bscr);
  void* scratch = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(bscr.data()) + 255) / 256 * 256);
  std::printf("[scratch] %s: %lld bytes\n", (std::ostringstream() << c).str().c_str(),
              static_cast<long long>(scratch_bytes));

  auto inc = [](const std::vector<float>& a, const std::vector<float>& a0) {
    std::vector<float> r(a.size());
    for (size_t i = 0; i < a.size(); ++i) r[i] = a[i] - a0[i];
    return r;
  };
  const auto rdq = inc(dq, dq0), rdk = inc(dk, dk0), rdv = inc(dv, dv0);

  for (const auto variant : bwd_variants()) {
    if (!kernels::sm90_bwd_variant_supported(variant, c.hd)) continue;
    const bool det = kernels::sm90_bwd_variant_deterministic(variant);
    tag = (std::ostringstream() << c).str() + " [" + kernels::sm90_bwd_variant_name(variant) + "]";
    SCOPED_TRACE(tag);
    std::vector<uint16_t> first_bits[3];
    for (int run = 0; run < (det ? 2 : 1); ++run) {
      Buffer bdq = sq_(dq0), bdk = sk_(dk0), bdv = sk_(dv0);
      p.dq = bfm(bdq);
      p.dk = bfm(bdk);
      p.dv = bfm(bdv);
      std::string why;
      ASSERT_TRUE(kernels::attention_bwd_sm90_supported(p, &why)) << why;
      gpu->synchronize();
      kernels::attention_bwd_sm90(p, scratch, ops::cuda_stream(*gpu), variant);
      gpu->synchronize();
      const std::string hang = kernels::sm90_bwd_take_hang_report();
      if (!hang.empty()) std::printf("  [hang] %s: %s\n", tag.c_str(), hang.c_str());
      EXPECT_EQ(hang, "") << "the barrier / semaphore protocol hung (results below are garbage)";
      if (run == 1) {
        EXPECT_EQ(download_bits(bdq), first_bits[0]) << "deterministic dq differs between two runs";
        EXPECT_EQ(download_bits(bdk), first_bits[1]) << "dk differs between two runs";
        EXPECT_EQ(download_bits(bdv), first_bits[2]) << "dv differs between two runs";
        std::printf("[determinism] %s: second run %s\n", tag.c_str(),
                    download_bits(bdq) == first_bits[0] && download_bits(bdk) == first_bits[1] &&
                            download_bits(bdv) == first_bits[2]
                        ? "bit-identical"
                        : "DIFFERS");
        continue;
      }
      first_bits[0] = download_bits(bdq);
      first_bits[1] = download_bits(bdk);
      first_bits[2] = download_bits(bdv);
      int64_t pw_q = 0, pw_k = 0, pw_v = 0;
      const auto gdq = gather(download(bdq), c.sq, c.hq * c.hd, q_row, q_batch, &pw_q);
      const auto gdk = gather(download(bdk), c.sk, c.hkv * c.hd, k_row, k_batch, &pw_k);
      const auto gdv = gather(download(bdv), c.sk, c.hkv * c.hd, k_row, k_batch, &pw_v);
      EXPECT_EQ(pw_q + pw_k + pw_v, 0) << "written outside the rows (padding): dq " << pw_q << " dk " << pw_k << " dv "
                                       << pw_v;
      const auto idq = inc(gdq, dq0), idk = inc(gdk, dk0), idv = inc(gdv, dv0);
      // Max abs error of each increment and where (row of the query / key, head, col): a tile
      // edge (row % 64 or % 128) or a consumer half (key row % 128 >= 64) points at the bug.
      auto worst = [&](const char* what, const std::vector<float>& got, const std::vector<float>& ref, int64_t heads) {
        double e = 0, mag = 0;
        size_t arg = 0;
        int64_t nan = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          mag = std::max(mag, static_cast<double>(std::abs(ref[i])));
          const double d = std::abs(static_cast<double>(got[i]) - ref[i]);
          if (std::isnan(d)) {
            if (nan++ == 0) arg = i;
            continue;
          }
          if (d > e && nan == 0) e = d, arg = i;
        }
        const int64_t i = static_cast<int64_t>(arg), col = i % c.hd, h = (i / c.hd) % heads, row = (i / (c.hd * heads));
        std::printf(
            "[accuracy] sm90 bwd %s %s: max abs err %.3g (max |ref| %.3g), %s at row %lld (b*S+s) head %lld col %lld "
            "(got %.5g want %.5g), NaN %lld\n",
            what, tag.c_str(), e, mag, nan ? "first NaN" : "worst", static_cast<long long>(row),
            static_cast<long long>(h), static_cast<long long>(col), got[arg], ref[arg], static_cast<long long>(nan));
        EXPECT_EQ(nan, 0) << what << " has NaN";
      };
      worst("dq", idq, rdq, c.hq);
      worst("dk", idk, rdk, c.hkv);
      worst("dv", idv, rdv, c.hkv);
      // An increment whose reference is exactly 0 (one visible key: softmax's gradient w.r.t.
      // the scores vanishes, so dK = 0) has no relative error; there the kernel's increment,
      // pure rounding noise of dS = P (dP - delta), must stay below the bf16 step of the
      // starting values (|d0| <= 0.05: 2^-12).
      auto check_inc = [&](const char* what, const std::vector<float>& got, const std::vector<float>& ref) {
        double ref_max = 0, got_max = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          ref_max = std::max(ref_max, static_cast<double>(std::abs(ref[i])));
          got_max = std::max(got_max, static_cast<double>(std::abs(got[i])));
        }
        if (ref_max > 0) {
          EXPECT_REL(got, ref, 3e-2);
          return;
        }
        std::printf("[accuracy] %s %s: reference increment is 0, max |increment| %.3g (tol 2^-12)\n", what, tag.c_str(),
                    got_max);
        EXPECT_LE(got_max, std::ldexp(1.0, -12)) << what << ": the reference increment is exactly 0";
      };
      check_inc("idq", idq, rdq);
      check_inc("idk", idk, rdk);
      check_inc("idv", idv, rdv);
      EXPECT_REL(gdq, dq, 1e-2);
      EXPECT_REL(gdk, dk, 1e-2);
      EXPECT_REL(gdv, dv, 1e-2);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionSm90BwdShapes,
                         ::testing::Values(
                             // Causal squares, MHA 8 x 128: one row, a partial tile, one row past a tile, ragged long.
                             Case{1, 1, 1, 8, 8, 128, true, 0}, Case{1, 7, 7, 8, 8, 128, true, 0},
                             Case{1, 129, 129, 8, 8, 128, true, 0}, Case{1, 1000, 1000, 8, 8, 128, true, 0},
                             Case{1, 3000, 3000, 8, 2, 128, true, 0},
                             // Ring blocks (Sq != Sk): every key visible, diag 0 with Sq < Sk, rows with no key
                             // (negative diag), diagonal inside the keys, no row sees any key, Sq > Sk with empty rows.
                             Case{1, 300, 500, 8, 2, 128, true, 500}, Case{1, 257, 700, 8, 2, 128, true, 0},
                             Case{1, 200, 333, 4, 2, 128, true, -50}, Case{1, 97, 300, 6, 3, 128, true, 240},
                             Case{1, 64, 64, 2, 2, 128, true, -1000}, Case{1, 130, 70, 4, 4, 128, true, -100},
                             // No mask.
                             Case{1, 77, 190, 8, 4, 128, false, 0}, Case{2, 150, 130, 8, 2, 128, false, 0},
                             // Batch 2, causal.
                             Case{2, 300, 300, 8, 2, 128, true, 0}, Case{2, 150, 130, 8, 2, 128, true, 64},
                             // Head dim 64, GQA 32/4.
                             Case{1, 7, 7, 32, 4, 64, true, 0}, Case{1, 129, 129, 32, 4, 64, true, 0},
                             Case{1, 1000, 1000, 32, 4, 64, true, 0}, Case{1, 77, 190, 8, 4, 64, false, 0},
                             Case{2, 129, 200, 8, 2, 64, true, -30}, Case{1, 3000, 3000, 8, 2, 64, true, 0},
                             Case{1, 1, 1, 32, 4, 64, true, 0},
                             // Head dim 64 ring blocks (the split's 128-row steps: halves that see no key of a block).
                             Case{1, 257, 700, 8, 2, 64, true, 0}, Case{1, 200, 333, 4, 2, 64, true, -50},
                             Case{1, 97, 300, 6, 3, 64, true, 240}, Case{1, 130, 70, 4, 4, 64, true, -100},
                             Case{2, 200, 260, 8, 2, 64, true, 60, 64},
                             // Strided views.
                             Case{2, 200, 260, 8, 2, 128, true, 60, 64}, Case{2, 150, 300, 8, 4, 64, false, 0, 24},
                             // More CTAs than SMs (132 on an H200): the deterministic key-block chains across waves.
                             Case{1, 2100, 2100, 16, 8, 128, true, 0}, Case{2, 1500, 1500, 16, 8, 64, true, 0},
                             Case{2, 1500, 1500, 16, 8, 64, false, 0}),
                         [](const ::testing::TestParamInfo<Case>& i) { return "case" + std::to_string(i.index); });

// What the launcher refuses (so a route can fall back), and the scratch size.
TEST_F(CudaAttentionSm90Bwd, SupportedRefusesWhatItCannotRun) {
  Buffer b = gpu->alloc(DType::BF16, 4096), l = gpu->alloc(DType::F32, 64);
  kernels::AttentionParams p;
  p.q = p.k = p.v = p.o = p.dout = bf(b);
  p.dq = p.dk = p.dv = bfm(b);
  p.lse = static_cast<const float*>(l.data());
  p.batch = 1;
  p.sq = p.sk = 8;
  p.hq = p.hkv = 2;
  p.hd = 128;
  p.q_row = p.k_row = 256;
  p.q_batch = p.k_batch = 2048;
  std::string why;
  EXPECT_TRUE(kernels::attention_bwd_sm90_supported(p, &why)) << why;
  // 1 x 2 heads x 128 padded rows: dq_acc 128 KiB, lse2 and delta 1 KiB each, semaphores 16 B (each rounded to 256).
  EXPECT_EQ(kernels::attention_bwd_sm90_scratch_bytes(p), 131072 + 1024 + 1024 + 256);
  auto refused = [&](kernels::AttentionParams x, const char* what) {
    std::string w;
    EXPECT_FALSE(kernels::attention_bwd_sm90_supported(x, &w)) << what;
    std::printf("[refused] %s: %s\n", what, w.c_str());
  };
  auto x = p;
  x.hd = 96;
  refused(x, "hd 96");
  x = p;
  x.dout = bf(b) + 4;
  refused(x, "dout misaligned");
  x = p;
  x.dq = nullptr;
  refused(x, "no dq");
  x = p;
  x.hq = 3;
  refused(x, "hq not a multiple of hkv");
  EXPECT_THROW(kernels::attention_bwd_sm90(x, nullptr, ops::cuda_stream(*gpu), kernels::Sm90BwdVariant::AtomicSplit),
               Error);
  EXPECT_THROW(kernels::attention_bwd_sm90(p, nullptr, ops::cuda_stream(*gpu), kernels::Sm90BwdVariant::AtomicSplit),
               Error);  // no scratch
}

}  // namespace
}  // namespace easyctx::test
