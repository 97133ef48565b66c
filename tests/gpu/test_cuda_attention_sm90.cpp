// The Hopper attention forward (kernels/attention_sm90.h) against the CPU fp32 reference on the
// same bf16-rounded inputs. First one wgmma tile through the TMA / descriptor / fragment layer
// (so a failure says which layer is wrong), then attention at odd shapes: ragged last tiles,
// Sq != Sk with diagonal offsets (ring blocks: every key visible, diag 0 with Sq < Sk, negative
// diag with empty rows, no row seeing any key), non-causal blocks, batch 2, GQA 32/4 x 64,
// small MHA heads x 128, and more work tiles than SMs (the persistent variant); every
// variant (kernels::sm90_fwd_variants()) that supports the head dim. Outputs are NaN-poisoned before each call; every case prints its
// errors. Skips without an sm_90 device (the kernel is sm_90a code only).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <utility>

#include "sm90_test_util.h"

namespace easyctx::test {
namespace {

// Line-buffered stdout: if a case hangs and the run is killed by a timeout, every line printed
// before it (the tile check, the earlier cases' errors) still reaches the log.
const bool kLineBuffered = [] { return std::setvbuf(stdout, nullptr, _IOLBF, 0) == 0; }();

using CudaAttentionSm90 = CudaAttentionSm90Test;

// One 64 x 128 x hd tile: S = Q K^T (both operands K-major from TMA'd, 128B-swizzled shared
// memory; the fp32 accumulator layout), then O = bf16(S) V (the accumulator reused as the
// register A operand; V MN-major). O is checked against bf16(S as the GPU computed it), so an
// error in S alone does not show up in O: O wrong means the V descriptor / A-fragment path.
TEST_F(CudaAttentionSm90, WgmmaTileMatchesHostGemm) {
  for (int hd : {128, 64}) {
    tag = "hd" + std::to_string(hd);
    const DType t = DType::BF16;
    auto q = rand(64 * hd, t), k = rand(128 * hd, t), v = rand(128 * hd, t);
    Buffer bq = upload(q, t), bk = upload(k, t), bv = upload(v, t), bs = gpu->alloc(DType::F32, 64 * 128),
           bo = gpu->alloc(DType::F32, 64 * hd);
    poison(bs);
    poison(bo);
    gpu->synchronize();
    kernels::sm90_wgmma_tile_check(bf(bq), bf(bk), bf(bv), hd, static_cast<float*>(bs.data()),
                                   static_cast<float*>(bo.data()), ops::cuda_stream(*gpu));
    gpu->synchronize();
    const std::string hang = kernels::sm90_take_hang_report();
    EXPECT_EQ(hang, "") << "hd " << hd << ": the TMA loads never completed their mbarrier (byte count / map / swizzle)";
    const auto gs = download(bs), go = download(bo);
    std::vector<float> rs(64 * 128), ro(64 * static_cast<size_t>(hd));
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 128; ++j) {
        double acc = 0;
        for (int d = 0; d < hd; ++d) acc += static_cast<double>(q[i * hd + d]) * k[j * hd + d];
        rs[i * 128 + j] = static_cast<float>(acc);
      }
    const auto ps = rounded(gs, t);  // P = bf16(S) as the GPU rounded it
    for (int i = 0; i < 64; ++i)
      for (int c = 0; c < hd; ++c) {
        double acc = 0;
        for (int j = 0; j < 128; ++j) acc += static_cast<double>(ps[i * 128 + j]) * v[j * hd + c];
        ro[i * hd + c] = static_cast<float>(acc);
      }
    const double es = max_abs(gs, rs), eo = max_abs(go, ro);
    std::printf("[tile] hd %d: S = Q K^T max abs err %.3g (|S| up to ~%.1f), O = bf16(S) V max abs err %.3g\n", hd, es,
                std::sqrt(hd / 9.0) * 4, eo);
    const int64_t bad_s =
        report_mismatches("S (Q K^T: K-major descriptors / TMA / accumulator layout)", gs, rs, 128, 1e-3, 1e-4);
    const int64_t bad_o =
        report_mismatches("O (P V: MN-major V descriptor / register-A fragment)", go, ro, hd, 1e-3, 1e-4);
    if (bad_o && hd == 128) {  // which reading of the MN-major descriptor offsets the hardware has
      poison(bo);
      gpu->synchronize();
      kernels::sm90_wgmma_tile_check(bf(bq), bf(bk), bf(bv), hd, static_cast<float*>(bs.data()),
                                     static_cast<float*>(bo.data()), ops::cuda_stream(*gpu), /*swap_v_offsets=*/true);
      gpu->synchronize();
      const auto go2 = download(bo);
      std::printf("  [diagnose] hd 128 with the V descriptor's LBO and SBO exchanged: O max abs err %.3g (%s)\n",
                  max_abs(go2, ro), max_abs(go2, ro) < 1e-2 ? "RIGHT: swap LBO/SBO in gemm_pv" : "still wrong");
    }
    EXPECT_EQ(bad_s, 0) << "hd " << hd << ": the Q K^T GEMM tile is wrong";
    EXPECT_EQ(bad_o, 0) << "hd " << hd << ": the P V GEMM tile is wrong (S " << (bad_s ? "wrong too" : "right") << ")";
  }
}

class CudaAttentionSm90Shapes : public CudaAttentionSm90, public ::testing::WithParamInterface<Case> {};

// The variants to run at head dim hd: every one that supports it by default;
// EASYCTX_SM90_VARIANT=<name> (sm90_fwd_variant_name: persistent, wide) runs that one.
std::vector<kernels::Sm90FwdVariant> variants(int64_t hd) {
  const char* e = std::getenv("EASYCTX_SM90_VARIANT");
  const std::string v = e ? e : "";
  std::vector<kernels::Sm90FwdVariant> all;
  for (const auto x : kernels::sm90_fwd_variants())
    if (kernels::sm90_fwd_variant_supported(x, hd)) {
      if (v == kernels::sm90_fwd_variant_name(x)) return {x};
      all.push_back(x);
    }
  return all;
}

TEST_P(CudaAttentionSm90Shapes, ForwardMatchesReference) {
  const Case c = GetParam();
  const DType t = DType::BF16;
  const int64_t nq = c.b * c.sq * c.hq * c.hd, nk = c.b * c.sk * c.hkv * c.hd, nl = c.b * c.hq * c.sq;
  auto q = rand(nq, t, -2, 2), k = rand(nk, t, -2, 2), v = rand(nk, t);
  // Device layout: rows of Hq*hd (Hkv*hd) elements plus c.pad, batches of S rows plus 4*c.pad;
  // the padding holds NaN, so reading it would show up in o, and writing o's padding too.
  const int64_t q_row = c.hq * c.hd + c.pad, q_batch = c.sq * q_row + 4 * c.pad, k_row = c.hkv * c.hd + c.pad,
                k_batch = c.sk * k_row + 4 * c.pad;
  const auto spread = [&](const std::vector<float>& x, int64_t rows, int64_t width, int64_t row, int64_t batch) {
    return spread_rows(x, c.b, rows, width, row, batch);
  };
  const auto gather = [&](const std::vector<float>& d, int64_t rows, int64_t width, int64_t row, int64_t batch,
                          int64_t* pad_written) { return gather_rows(d, c.b, rows, width, row, batch, pad_written); };
  Buffer bq = upload(spread(q, c.sq, c.hq * c.hd, q_row, q_batch), t),
         bk = upload(spread(k, c.sk, c.hkv * c.hd, k_row, k_batch), t),
         bv = upload(spread(v, c.sk, c.hkv * c.hd, k_row, k_batch), t), bo = gpu->alloc(t, c.b * q_batch),
         bl = gpu->alloc(DType::F32, nl);

  ops::AttentionBlock blk;
  blk.scale = 1.0 / std::sqrt(static_cast<double>(c.hd));
  blk.causal = c.causal;
  blk.q_offset = c.diag;
  blk.k_offset = 0;
  std::vector<float> o(static_cast<size_t>(nq)), l(static_cast<size_t>(nl));
  cpu->attention_fwd(host(q, {c.b, c.sq, c.hq, c.hd}), host(k, {c.b, c.sk, c.hkv, c.hd}),
                     host(v, {c.b, c.sk, c.hkv, c.hd}), blk, host(o, {c.b, c.sq, c.hq, c.hd}), host(l, {nl}));

  kernels::AttentionParams p = case_params(c, blk.scale, q_row, q_batch, k_row, k_batch);
  p.q = bf(bq);
  p.k = bf(bk);
  p.v = bf(bv);
  p.o_out = static_cast<__nv_bfloat16*>(bo.data());
  p.lse_out = static_cast<float*>(bl.data());
  std::string why;
  ASSERT_TRUE(kernels::attention_fwd_sm90_supported(p, &why)) << why;

  // Persistent variants run twice: with the default L2 sections (usually one section at these
  // sizes) and with sections of 5 kv heads (several, the last one partial where hq * batch is
  // not a multiple of 5 groups).
  std::vector<std::pair<kernels::Sm90FwdVariant, int64_t>> runs;
  for (const auto variant : variants(c.hd)) {
    runs.push_back({variant, 0});
    if (variant == kernels::Sm90FwdVariant::Persistent) runs.push_back({variant, 5 * c.sk * c.hd * 4});
  }
  for (const auto& [variant, l2_bytes] : runs) {
    tag = (std::ostringstream() << c).str() + " [" + kernels::sm90_fwd_variant_name(variant) +
          (l2_bytes ? ", L2 sections of 5 kv heads" : "") + "]";
    SCOPED_TRACE(tag);
    poison(bo);
    poison(bl);
    gpu->synchronize();
    kernels::sm90_set_l2_section_bytes(l2_bytes);
    kernels::attention_fwd_sm90(p, ops::cuda_stream(*gpu), variant);
    kernels::sm90_set_l2_section_bytes(0);
    gpu->synchronize();
    const std::string hang = kernels::sm90_take_hang_report();
    if (!hang.empty()) std::printf("  [hang] %s: %s\n", tag.c_str(), hang.c_str());
    EXPECT_EQ(hang, "") << "the producer/consumer barrier protocol hung (results below are garbage)";
    int64_t pad_written = 0;
    const auto go = gather(download(bo), c.sq, c.hq * c.hd, q_row, q_batch, &pad_written), gl = download(bl);
    EXPECT_EQ(pad_written, 0) << "the kernel wrote o outside its rows (into the padding between rows / batches)";

    // o: relative (as the other kernels' tests) and max abs; the worst element's coordinates
    // (row % 128 and row % 64 tell a tile edge or a consumer warpgroup apart).
    double o_max = 0;
    size_t o_arg = 0;
    int64_t o_nan = 0;
    for (size_t i = 0; i < o.size(); ++i) {
      const double d = std::abs(static_cast<double>(go[i]) - o[i]);
      if (std::isnan(d)) {
        if (o_nan++ == 0) o_arg = i;
        continue;
      }
      if (d > o_max && o_nan == 0) o_max = d, o_arg = i;
    }
    {
      const int64_t i = static_cast<int64_t>(o_arg), col = i % c.hd, h = (i / c.hd) % c.hq,
                    row = (i / (c.hd * c.hq)) % c.sq, bb = i / (c.hd * c.hq * c.sq);
      std::printf(
          "[accuracy] sm90 o %s: max abs err %.3g, %s at b %lld row %lld (row %% 128 = %lld) head %lld col %lld "
          "(got %.5g want %.5g), NaN %lld\n",
          tag.c_str(), o_max, o_nan ? "first NaN" : "worst", static_cast<long long>(bb), static_cast<long long>(row),
          static_cast<long long>(row % 128), static_cast<long long>(h), static_cast<long long>(col), go[o_arg],
          o[o_arg], static_cast<long long>(o_nan));
    }
    // Where the error sits, when it is large: max abs error of o by the row's 16-row group
    // within its 128-row query tile (group g: consumer warpgroup g / 4, its warp g % 4).
    if (o_max > 3e-2 || o_nan) {
      double by_group[8] = {};
      for (size_t i = 0; i < o.size(); ++i) {
        const int64_t row = (static_cast<int64_t>(i) / (c.hd * c.hq)) % c.sq;
        const double d = std::abs(static_cast<double>(go[i]) - o[i]);
        double& g = by_group[(row % 128) / 16];
        g = std::isnan(d) ? INFINITY : std::max(g, d);
      }
      std::printf("  [where] max abs err of o by 16-row group of the 128-row tile:");
      for (double g : by_group) std::printf(" %.3g", g);
      std::printf("\n");
    }
    EXPECT_EQ(o_nan, 0) << "o has NaN (unwritten rows stay NaN-poisoned)";
    EXPECT_REL(go, o, 1e-2);
    EXPECT_LT(o_max, 3e-2);  // bf16 output of values |o| <= 1 (P in bf16, fp32 accumulation)

    double lse_err = 0;
    int64_t empty = 0, bad_rows = 0;
    for (size_t i = 0; i < l.size(); ++i) {
      const int64_t row = static_cast<int64_t>(i) % c.sq, h = (static_cast<int64_t>(i) / c.sq) % c.hq;
      if (std::isinf(l[i])) {
        ++empty;
        if (!(std::isinf(gl[i]) && gl[i] < 0) && bad_rows++ < 5)
          std::printf("  [mismatch] lse head %lld row %lld sees no key: want -inf, got %.6g\n",
                      static_cast<long long>(h), static_cast<long long>(row), gl[i]);
        continue;
      }
      const double d = std::abs(static_cast<double>(gl[i]) - l[i]);
      if (!(d < 2e-3) && bad_rows++ < 5)
        std::printf("  [mismatch] lse head %lld row %lld: got %.6g want %.6g\n", static_cast<long long>(h),
                    static_cast<long long>(row), gl[i], l[i]);
      lse_err = std::isnan(d) ? INFINITY : std::max(lse_err, d);
    }
    std::printf("[accuracy] sm90 lse %s: max abs err %.3g nats, %lld empty rows, %lld bad rows\n", tag.c_str(), lse_err,
                static_cast<long long>(empty), static_cast<long long>(bad_rows));
    EXPECT_EQ(bad_rows, 0);
    EXPECT_LT(lse_err, 2e-3);  // absolute, in nats
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionSm90Shapes,
                         ::testing::Values(
                             // Causal squares, MHA 8 x 128: one row, one partial tile, exactly one tile, one row past
                             // a tile, many tiles with a ragged end, a long one (the CPU reference sets its size).
                             Case{1, 1, 1, 8, 8, 128, true, 0}, Case{1, 7, 7, 8, 8, 128, true, 0},
                             Case{1, 128, 128, 8, 8, 128, true, 0}, Case{1, 129, 129, 8, 8, 128, true, 0},
                             Case{1, 1000, 1000, 8, 8, 128, true, 0}, Case{1, 4099, 4099, 4, 2, 128, true, 0},
                             // Ring blocks (Sq != Sk, diag = q_offset - k_offset).
                             Case{1, 300, 500, 8, 2, 128, true, 500},  // diag = Sk: every key visible
                             Case{1, 257, 700, 8, 2, 128, true, 0},    // diag 0, Sq < Sk
                             Case{1, 200, 333, 4, 2, 128, true, -50},  // rows 0..49 see no key
                             Case{1, 97, 300, 6, 3, 128, true, 240},   // diagonal inside the keys
                             Case{1, 64, 64, 2, 2, 128, true, -1000},  // no row sees any key (no tile at all)
                             Case{1, 130, 70, 4, 4, 128, true, -100},  // Sq > Sk, rows 0..99 empty
                             // Blocks without a mask.
                             Case{1, 77, 190, 8, 4, 128, false, 0}, Case{1, 256, 384, 32, 4, 128, false, 0},
                             Case{2, 150, 130, 8, 2, 128, false, 0},
                             // Batch 2, causal.
                             Case{2, 300, 300, 8, 2, 128, true, 0}, Case{2, 150, 130, 8, 2, 128, true, 64},
                             // Head dim 64, GQA 32/4.
                             Case{1, 7, 7, 32, 4, 64, true, 0}, Case{1, 256, 256, 32, 4, 64, true, 0},
                             Case{1, 1000, 1000, 32, 4, 64, true, 0}, Case{1, 77, 190, 8, 4, 64, false, 0},
                             Case{2, 129, 200, 8, 2, 64, true, -30},
                             // Strided views (rows and batches padded, as slices of a wider buffer would be).
                             Case{2, 200, 260, 8, 2, 128, true, 60, 64}, Case{2, 150, 300, 8, 4, 64, false, 0, 24},
                             // Persistent CTAs (one per SM, 132 on an H200) with several work tiles each: tiles of
                             // different lengths in one CTA (the K/V ring, the Q buffer and the work tile ring
                             // carried across them, the ping-pong ring across tile boundaries), 128- and 192-row
                             // tiles (wide: hd 64).
                             Case{2, 1000, 1000, 32, 8, 128, true, 0},  // 8 x 32 x 2 = 512 tiles of 128 rows
                             Case{3, 1500, 1500, 32, 4, 64, true, 0},   // 8 x 32 x 3 = 768 tiles of 192 rows (wide)
                             Case{1, 129, 129, 67, 1, 128, false, 0},   // 134 tiles: just past one per SM
                             Case{1, 193, 193, 67, 1, 64, true, 0},     // 134 tiles, of 192 rows (wide) and of 128
                             // Empty work tiles (rows 0..399 see no key) mixed with full ones in every CTA.
                             Case{2, 700, 300, 40, 8, 128, true, -400}, Case{2, 700, 300, 36, 4, 64, true, -400},
                             // hd 64, MHA-like and unmasked with many tiles (every variant, 2 and 3 consumers).
                             Case{2, 600, 900, 48, 12, 64, false, 0}),
                         [](const ::testing::TestParamInfo<Case>& i) { return "case" + std::to_string(i.index); });

// What the launcher refuses (so the route can fall back): every check is host-side.
TEST_F(CudaAttentionSm90, SupportedRefusesWhatTmaCannotLoad) {
  Buffer b = gpu->alloc(DType::BF16, 4096), l = gpu->alloc(DType::F32, 64);
  kernels::AttentionParams p;
  p.q = p.k = p.v = bf(b);
  p.o_out = static_cast<__nv_bfloat16*>(b.data());
  p.lse_out = static_cast<float*>(l.data());
  p.batch = 1;
  p.sq = p.sk = 8;
  p.hq = p.hkv = 2;
  p.hd = 128;
  p.q_row = p.k_row = 256;
  p.q_batch = p.k_batch = 2048;
  std::string why;
  EXPECT_TRUE(kernels::attention_fwd_sm90_supported(p, &why)) << why;
  auto refused = [&](kernels::AttentionParams x, const char* what) {
    std::string w;
    EXPECT_FALSE(kernels::attention_fwd_sm90_supported(x, &w)) << what;
    std::printf("[refused] %s: %s\n", what, w.c_str());
  };
  auto x = p;
  x.hd = 96;
  refused(x, "hd 96");
  x = p;
  x.q = bf(b) + 4;  // 8 bytes off
  refused(x, "q misaligned");
  x = p;
  x.k_row = 260;
  refused(x, "k row stride not a multiple of 8");
  x = p;
  x.hq = 3;
  x.hkv = 2;
  refused(x, "hq not a multiple of hkv");
  x = p;
  x.sk = 0;
  refused(x, "no keys");
  EXPECT_THROW(kernels::attention_fwd_sm90(x, ops::cuda_stream(*gpu)), Error);
  // The 3-consumer variants hold hd 64 only: hd 128 is refused, not run.
  using V = kernels::Sm90FwdVariant;
  EXPECT_FALSE(kernels::sm90_fwd_variant_supported(V::Wide, 128));
  EXPECT_TRUE(kernels::sm90_fwd_variant_supported(V::Wide, 64));
  EXPECT_THROW(kernels::attention_fwd_sm90(p, ops::cuda_stream(*gpu), V::Wide), Error);
  EXPECT_NE(kernels::sm90_fwd_resolve(V::Auto, 128), V::Auto);
  EXPECT_TRUE(kernels::sm90_fwd_variant_supported(kernels::sm90_fwd_resolve(V::Auto, 64), 64));
}

}  // namespace
}  // namespace easyctx::test
