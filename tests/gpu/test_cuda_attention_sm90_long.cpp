// The Hopper attention kernels (kernels/attention_sm90.h) at a million tokens per call, against
// the CPU backend's attention on the same bf16-rounded inputs (forward in fp64, backward in
// fp32): a causal square of 1,048,573 tokens (hd 128 and 64, GQA 2/1) and unmasked ring
// blocks of 33 x 1,048,573 and 1,048,573 x 33. Every forward variant, then every backward
// variant from the route's forward (Auto), the deterministic ones twice (bit-identical over the
// whole call). test_cuda_attention_sm90 and _bwd cover the odd shapes up to a few thousand
// rows; this one the lengths the trainer runs, where a 32-bit offset, a tile count or a long
// fp32 accumulation would break first (it found the forward's rescale drift).
//
// A full CPU reference of a 1M-token causal square is ~10^14 operations, so the reference
// covers blocks of rows: the first 48 rows, 48 rows across the 2^19 boundary and the last 48
// (o, lse and dq of those rows: every key they see), and the keys that only the last block
// sees (dk, dv of the last 48 keys); the unmasked blocks are checked whole. The reference
// backward of a row block runs in key chunks (its dq summed over the chunks) on every core, with
// the kernel's own o and lse as input, as the backward contract has them. The gradients start
// at 0 here (their += contract is test_cuda_attention_sm90_bwd's). Skips without an sm_90 device.
#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "cuda_test_util.h"
#include "kernels/attention_sm90.h"
#include "ops/cuda/cuda_attention.h"

namespace easyctx::test {
namespace {

const bool kLineBuffered = [] { return std::setvbuf(stdout, nullptr, _IOLBF, 0) == 0; }();

struct LongCase {
  int64_t sq, sk, hq, hkv, hd;
  bool causal;
};

std::ostream& operator<<(std::ostream& os, const LongCase& c) {
  return os << "Sq" << c.sq << " Sk" << c.sk << " Hq" << c.hq << " Hkv" << c.hkv << " hd" << c.hd
            << (c.causal ? " causal" : " full");
}

struct Rows {
  int64_t begin, end;
};

class CudaAttentionSm90Long : public CudaOpsTest, public ::testing::WithParamInterface<LongCase> {
 protected:
  void SetUp() override {
    CudaOpsTest::SetUp();
    if (IsSkipped()) return;
    if (!kernels::sm90_device_available())
      GTEST_SKIP() << "needs an sm_90 device (H100/H200): the kernels are sm_90a code";
  }
  // Elements [row0, row1) x width of a device bf16 buffer as floats.
  std::vector<float> download_rows(const Buffer& b, int64_t row0, int64_t row1, int64_t width) {
    std::vector<float> v(static_cast<size_t>((row1 - row0) * width));
    Tensor dst(v.data(), DType::F32, {static_cast<int64_t>(v.size())});
    gpu->copy(dst, b.flat().slice_flat(row0 * width, {static_cast<int64_t>(v.size())}));
    return v;
  }
};

// Rows [r.begin, r.end) of a [S, width] host array.
std::vector<float> rows_of(const std::vector<float>& x, Rows r, int64_t width) {
  return std::vector<float>(x.begin() + r.begin * width, x.begin() + r.end * width);
}

// lse of rows r of a [H, S] array, as [H, rows].
std::vector<float> lse_rows(const std::vector<float>& lse, Rows r, int64_t h, int64_t s) {
  std::vector<float> out;
  for (int64_t i = 0; i < h; ++i) out.insert(out.end(), lse.begin() + i * s + r.begin, lse.begin() + i * s + r.end);
  return out;
}

// Runs f(task) for task in [0, n) on every hardware thread.
template <typename F>
void parallel_tasks(int64_t n, F f) {
  const int64_t w = std::max<int64_t>(1, std::min<int64_t>(n, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < w; ++t)
    pool.emplace_back([&, t] {
      for (int64_t i = t; i < n; i += w) f(i);
    });
  for (auto& th : pool) th.join();
}

TEST_P(CudaAttentionSm90Long, MillionTokenCallsMatchReference) {
  const LongCase c = GetParam();
  const DType t = DType::BF16;
  const int64_t qw = c.hq * c.hd, kw = c.hkv * c.hd;
  tag = (std::ostringstream() << c).str();
  std::printf("[long] %s: generating inputs\n", tag.c_str());
  auto q = rand(static_cast<size_t>(c.sq * qw), t, -2, 2), k = rand(static_cast<size_t>(c.sk * kw), t, -2, 2),
       v = rand(static_cast<size_t>(c.sk * kw), t), dout = rand(static_cast<size_t>(c.sq * qw), t);
  Buffer bq = upload(q, t), bk = upload(k, t), bv = upload(v, t), bdo = upload(dout, t);
  Buffer bo = gpu->alloc(t, c.sq * qw), bl = gpu->alloc(DType::F32, c.hq * c.sq), bdq = gpu->alloc(t, c.sq * qw),
         bdk = gpu->alloc(t, c.sk * kw), bdv = gpu->alloc(t, c.sk * kw);

  // The rows the reference covers; keys whose every viewer is in `blocks` (dk, dv compared).
  // Causal (diag 0): key j is seen by rows >= j only, so the last block alone sees its keys.
  const int64_t mid = int64_t{1} << 19;
  const std::vector<Rows> blocks =
      c.causal ? std::vector<Rows>{{0, 48}, {mid - 24, mid + 24}, {c.sq - 48, c.sq}} : std::vector<Rows>{{0, c.sq}};
  const Rows keys = c.causal ? Rows{c.sq - 48, c.sk} : Rows{0, c.sk};
  ops::AttentionBlock blk;
  blk.scale = 1.0 / std::sqrt(static_cast<double>(c.hd));
  blk.causal = c.causal;
  const auto key_end = [&](Rows r) { return c.causal ? std::min(c.sk, r.end) : c.sk; };

  // Forward reference per block in fp64 (rows r against keys [0, key_end)): an fp32 sum of a
  // million exponentials is itself off by up to ~2e-4 in lse, the size of what is pinned below.
  const auto f64 = [](const float* x, size_t n) { return std::vector<double>(x, x + n); };
  const int64_t ke_max = c.causal ? std::min(c.sk, blocks.back().end) : c.sk;
  const std::vector<double> k64 = f64(k.data(), static_cast<size_t>(ke_max * kw)), v64 = f64(v.data(), k64.size());
  std::vector<std::vector<double>> ro(blocks.size()), rl(blocks.size());
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const Rows r = blocks[bi];
    const int64_t n = r.end - r.begin, ke = key_end(r);
    auto qb = f64(q.data() + r.begin * qw, static_cast<size_t>(n * qw));
    ro[bi].resize(static_cast<size_t>(n * qw));
    rl[bi].resize(static_cast<size_t>(c.hq * n));
    ops::AttentionBlock b = blk;
    b.q_offset = r.begin;
    const auto d = [](const double* x, int64_t rows, int64_t h, int64_t hd) {
      return Tensor(const_cast<double*>(x), DType::F64, {1, rows, h, hd});
    };
    cpu->attention_fwd(d(qb.data(), n, c.hq, c.hd), d(k64.data(), ke, c.hkv, c.hd), d(v64.data(), ke, c.hkv, c.hd), b,
                       d(ro[bi].data(), n, c.hq, c.hd), Tensor(rl[bi].data(), DType::F64, {c.hq * n}));
  }

  // Shapes, strides, scale and diagonal as the backend and bench_attention build them.
  kernels::AttentionParams p =
      ops::cuda::attention_params("test_cuda_attention_sm90_long", bq.view({1, c.sq, c.hq, c.hd}),
                                  bk.view({1, c.sk, c.hkv, c.hd}), bv.view({1, c.sk, c.hkv, c.hd}), blk);
  p.o_out = static_cast<__nv_bfloat16*>(bo.data());
  p.lse_out = static_cast<float*>(bl.data());
  std::string why;
  ASSERT_TRUE(kernels::attention_fwd_sm90_supported(p, &why)) << why;

  const auto run_fwd = [&](kernels::Sm90FwdVariant variant) {
    poison(bo);
    poison(bl);
    gpu->synchronize();
    kernels::attention_fwd_sm90(p, ops::cuda_stream(*gpu), variant);
    gpu->synchronize();
    const std::string hang = kernels::sm90_take_hang_report();
    EXPECT_EQ(hang, "") << "the forward's barrier protocol hung";
  };
  std::vector<kernels::Sm90FwdVariant> fwd;
  for (const auto x : kernels::sm90_fwd_variants())
    if (kernels::sm90_fwd_variant_supported(x, c.hd)) fwd.push_back(x);
  for (const auto variant : fwd) {
    const std::string vtag = tag + " [" + kernels::sm90_fwd_variant_name(variant) + "]";
    SCOPED_TRACE(vtag);
    run_fwd(variant);
    const auto gl_all = download(bl);
    for (size_t bi = 0; bi < blocks.size(); ++bi) {
      const Rows r = blocks[bi];
      const auto go = download_rows(bo, r.begin, r.end, qw), gl = lse_rows(gl_all, r, c.hq, c.sq);
      double lse_err = 0;
      for (size_t i = 0; i < gl.size(); ++i)
        lse_err = std::max(lse_err, std::abs(static_cast<double>(gl[i]) - rl[bi][i]));
      const double e = rel_error(go, ro[bi]);
      std::printf("[accuracy] sm90 fwd %s rows [%lld, %lld): o rel err %.3g, lse max abs err %.3g\n", vtag.c_str(),
                  static_cast<long long>(r.begin), static_cast<long long>(r.end), e, lse_err);
      EXPECT_LT(e, 1e-2) << "o, rows [" << r.begin << ", " << r.end << ")";
      // The drift this pins (a rescale factor off 1 by an ulp on every key tile) measured
      // 1.5e-3 on the last rows; fixed, 2.6e-6.
      const double lse_tol = 2e-5;
      EXPECT_LT(lse_err, lse_tol) << "lse, rows [" << r.begin << ", " << r.end << ")";
    }
  }

  // The backward's o and lse: the route's forward (Auto), as the trainer has them.
  run_fwd(kernels::Sm90FwdVariant::Auto);
  const auto gl_all = download(bl);
  // Reference backward per block from the kernel's o and lse (bf16 o as stored): dq of its
  // rows, and its rows' part of dk, dv over keys [0, key_end), in key chunks on every core, of
  // which the compared keys are kept.
  std::vector<std::vector<double>> rdq(blocks.size());
  const int64_t nkeys = keys.end - keys.begin;
  std::vector<double> rdk_keys(static_cast<size_t>(nkeys * kw), 0.0), rdv_keys(rdk_keys.size(), 0.0);
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const Rows r = blocks[bi];
    const int64_t n = r.end - r.begin, ke = key_end(r);
    auto qb = rows_of(q, r, qw), dob = rows_of(dout, r, qw), ob = download_rows(bo, r.begin, r.end, qw),
         lb = lse_rows(gl_all, r, c.hq, c.sq);
    // 64 chunks of the longer side (keys, or rows for the unmasked 1M x 33 block), so every
    // core works and the partials sum to one copy of the long side.
    const int64_t kchunk = ke >= n ? (ke + 63) / 64 : ke, nkc = (ke + kchunk - 1) / kchunk;
    const int64_t rchunk = ke >= n ? n : (n + 63) / 64, nrc = (n + rchunk - 1) / rchunk;
    std::vector<std::vector<float>> pdq(static_cast<size_t>(nkc * nrc)), pdk(pdq.size()), pdv(pdq.size());
    parallel_tasks(nkc * nrc, [&](int64_t task) {
      const int64_t kc = task % nkc, rc = task / nkc;
      const int64_t k0 = kc * kchunk, k1 = std::min(ke, k0 + kchunk), r0 = rc * rchunk, r1 = std::min(n, r0 + rchunk);
      const int64_t nk = k1 - k0, nr = r1 - r0;
      std::vector<float> lse_t;
      for (int64_t h = 0; h < c.hq; ++h) lse_t.insert(lse_t.end(), lb.begin() + h * n + r0, lb.begin() + h * n + r1);
      auto& dq = pdq[static_cast<size_t>(task)];
      auto& dk = pdk[static_cast<size_t>(task)];
      auto& dv = pdv[static_cast<size_t>(task)];
      dq.assign(static_cast<size_t>(nr * qw), 0.f);
      dk.assign(static_cast<size_t>(nk * kw), 0.f);
      dv.assign(dk.size(), 0.f);
      ops::AttentionBlock b = blk;
      b.q_offset = r.begin + r0;
      b.k_offset = k0;
      b.accumulate = true;
      auto f = [](const float* x, int64_t rows, int64_t h, int64_t d) {
        return Tensor(const_cast<float*>(x), DType::F32, {1, rows, h, d});
      };
      cpu->attention_bwd(f(qb.data() + r0 * qw, nr, c.hq, c.hd), f(k.data() + k0 * kw, nk, c.hkv, c.hd),
                         f(v.data() + k0 * kw, nk, c.hkv, c.hd), f(ob.data() + r0 * qw, nr, c.hq, c.hd),
                         Tensor(lse_t.data(), DType::F32, {c.hq * nr}), f(dob.data() + r0 * qw, nr, c.hq, c.hd), b,
                         f(dq.data(), nr, c.hq, c.hd), f(dk.data(), nk, c.hkv, c.hd), f(dv.data(), nk, c.hkv, c.hd));
    });
    rdq[bi].assign(static_cast<size_t>(n * qw), 0.0);
    for (int64_t task = 0; task < nkc * nrc; ++task) {  // a fixed order
      const int64_t kc = task % nkc, rc = task / nkc, k0 = kc * kchunk, r0 = rc * rchunk;
      const auto& dq = pdq[static_cast<size_t>(task)];
      for (size_t i = 0; i < dq.size(); ++i) rdq[bi][static_cast<size_t>(r0 * qw) + i] += dq[i];
      const auto& dk = pdk[static_cast<size_t>(task)];
      const auto& dv = pdv[static_cast<size_t>(task)];
      const int64_t j0 = std::max(k0, keys.begin), j1 = std::min(k0 + static_cast<int64_t>(dk.size()) / kw, keys.end);
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t e = 0; e < kw; ++e) {
          rdk_keys[static_cast<size_t>((j - keys.begin) * kw + e)] += dk[static_cast<size_t>((j - k0) * kw + e)];
          rdv_keys[static_cast<size_t>((j - keys.begin) * kw + e)] += dv[static_cast<size_t>((j - k0) * kw + e)];
        }
    }
  }

  p.o = static_cast<const __nv_bfloat16*>(bo.data());
  p.lse = static_cast<const float*>(bl.data());
  p.dout = static_cast<const __nv_bfloat16*>(bdo.data());
  p.dq = static_cast<__nv_bfloat16*>(bdq.data());
  p.dk = static_cast<__nv_bfloat16*>(bdk.data());
  p.dv = static_cast<__nv_bfloat16*>(bdv.data());
  ASSERT_TRUE(kernels::attention_bwd_sm90_supported(p, &why)) << why;
  const int64_t scratch_bytes = kernels::attention_bwd_sm90_scratch_bytes(p);
  ASSERT_GT(scratch_bytes, 0);
  Buffer bscr = gpu->alloc(DType::F32, scratch_bytes / 4 + 64);
  poison(bscr);
  void* scratch = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(bscr.data()) + 255) / 256 * 256);
  for (const auto variant : kernels::sm90_bwd_variants()) {
    if (!kernels::sm90_bwd_variant_supported(variant, c.hd)) continue;
    const bool det = kernels::sm90_bwd_variant_deterministic(variant);
    const std::string vtag = tag + " [" + kernels::sm90_bwd_variant_name(variant) + "]";
    SCOPED_TRACE(vtag);
    std::vector<uint16_t> first[3];
    for (int run = 0; run < (det ? 2 : 1); ++run) {
      for (const Buffer* g : {&bdq, &bdk, &bdv}) gpu->fill(g->flat(), 0.0);
      gpu->synchronize();
      kernels::attention_bwd_sm90(p, scratch, ops::cuda_stream(*gpu), variant);
      gpu->synchronize();
      const std::string hang = kernels::sm90_bwd_take_hang_report();
      EXPECT_EQ(hang, "") << "the backward's barrier / semaphore protocol hung";
      if (run == 1) {
        const bool same =
            download_bits(bdq) == first[0] && download_bits(bdk) == first[1] && download_bits(bdv) == first[2];
        std::printf("[determinism] %s: second run %s\n", vtag.c_str(), same ? "bit-identical" : "DIFFERS");
        EXPECT_TRUE(same) << "a deterministic variant's dq / dk / dv differ between two runs";
        continue;
      }
      if (det) first[0] = download_bits(bdq), first[1] = download_bits(bdk), first[2] = download_bits(bdv);
      for (size_t bi = 0; bi < blocks.size(); ++bi) {
        const Rows r = blocks[bi];
        const double e = rel_error(download_rows(bdq, r.begin, r.end, qw), rdq[bi]);
        std::printf("[accuracy] sm90 bwd %s dq rows [%lld, %lld): rel err %.3g\n", vtag.c_str(),
                    static_cast<long long>(r.begin), static_cast<long long>(r.end), e);
        EXPECT_LT(e, 1e-2) << "dq, rows [" << r.begin << ", " << r.end << ")";
      }
      const double ek = rel_error(download_rows(bdk, keys.begin, keys.end, kw), rdk_keys),
                   ev = rel_error(download_rows(bdv, keys.begin, keys.end, kw), rdv_keys);
      std::printf("[accuracy] sm90 bwd %s keys [%lld, %lld): dk rel err %.3g, dv rel err %.3g\n", vtag.c_str(),
                  static_cast<long long>(keys.begin), static_cast<long long>(keys.end), ek, ev);
      EXPECT_LT(ek, 1e-2) << "dk, keys [" << keys.begin << ", " << keys.end << ")";
      EXPECT_LT(ev, 1e-2) << "dv, keys [" << keys.begin << ", " << keys.end << ")";
    }
  }
}

// 2^20 - 3 tokens: odd, so every tile size leaves a ragged last tile.
constexpr int64_t kMillion = (int64_t{1} << 20) - 3;

INSTANTIATE_TEST_SUITE_P(Lengths, CudaAttentionSm90Long,
                         ::testing::Values(LongCase{kMillion, kMillion, 2, 1, 128, true},
                                           LongCase{kMillion, kMillion, 2, 1, 64, true},
                                           LongCase{33, kMillion, 2, 1, 128, false},
                                           LongCase{kMillion, 33, 2, 1, 64, false}),
                         [](const ::testing::TestParamInfo<LongCase>& i) { return "case" + std::to_string(i.index); });

}  // namespace
}  // namespace easyctx::test
