// Forward correctness of the CPU ops against naive fp64 references (odd shapes, both
// dtypes), plus AdamW, conversions and determinism.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>

#include "ops/half.h"
#include "ops_test_util.h"

namespace easyctx::test {
namespace {

using ops::DType;
using ops::Tensor;

double val(const Tensor& t, int64_t i) {
  return t.dtype == DType::F64 ? t.ptr<double>()[i] : static_cast<double>(t.ptr<float>()[i]);
}

class Matmul : public OpsFixture, public ::testing::WithParamInterface<std::tuple<bool, bool, DType>> {};

TEST_P(Matmul, MatchesNaiveWithAlphaBeta) {
  const auto [ta, tb, dt] = GetParam();
  for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {7, 13, 5}, {97, 33, 300}, {130, 517, 71}}) {
    ops::Buffer a = rand(dt, m * k), b = rand(dt, k * n), c = rand(dt, m * n), c0 = be->alloc(dt, m * n);
    be->copy(c0.flat(), c.flat());
    const double alpha = 0.7, beta = -1.3;
    be->matmul(ta ? a.view({k, m}) : a.view({m, k}), ta, tb ? b.view({n, k}) : b.view({k, n}), tb, c.view({m, n}),
               alpha, beta);
    // Error relative to the size of the two terms (their sum may cancel).
    double err = 0, scale = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p)
          s += val(a.flat(), ta ? p * m + i : i * k + p) * val(b.flat(), tb ? j * k + p : p * n + j);
        const double ref = alpha * s + beta * val(c0.flat(), i * n + j), got = val(c.flat(), i * n + j);
        err += (got - ref) * (got - ref);
        scale += std::pow(std::abs(alpha * s) + std::abs(beta * val(c0.flat(), i * n + j)), 2);
      }
    EXPECT_LT(std::sqrt(err / scale), dt == DType::F64 ? 1e-13 : 2e-6) << m << "x" << n << "x" << k;
  }
}

INSTANTIATE_TEST_SUITE_P(All, Matmul,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(DType::F32, DType::F64)));

// Naive attention for one block: o and lse in fp64.
void naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, const ops::AttentionBlock& blk,
                     std::vector<double>& o, std::vector<double>& lse) {
  const int64_t B = q.dim(0), Sq = q.dim(1), Hq = q.dim(2), D = q.dim(3), Sk = k.dim(1), Hk = k.dim(2);
  o.assign(static_cast<size_t>(q.numel()), 0.0);
  lse.assign(static_cast<size_t>(B * Hq * Sq), -INFINITY);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Sq; ++i) {
        const int64_t g = h / (Hq / Hk);
        std::vector<double> s;
        for (int64_t j = 0; j < Sk; ++j) {
          if (blk.causal && blk.k_offset + j > blk.q_offset + i) break;
          double d = 0;
          for (int64_t c = 0; c < D; ++c)
            d += val(q, ((b * Sq + i) * Hq + h) * D + c) * val(k, ((b * Sk + j) * Hk + g) * D + c);
          s.push_back(d * blk.scale);
        }
        if (s.empty()) continue;
        double mx = *std::max_element(s.begin(), s.end()), sum = 0;
        for (double x : s) sum += std::exp(x - mx);
        lse[static_cast<size_t>((b * Hq + h) * Sq + i)] = mx + std::log(sum);
        for (size_t j = 0; j < s.size(); ++j)
          for (int64_t c = 0; c < D; ++c)
            o[static_cast<size_t>(((b * Sq + i) * Hq + h) * D + c)] +=
                std::exp(s[j] - mx) / sum * val(v, ((b * Sk + static_cast<int64_t>(j)) * Hk + g) * D + c);
      }
}

class OpsForward : public OpsFixture, public ::testing::WithParamInterface<DType> {};

TEST_P(OpsForward, AttentionMatchesNaiveWithGqaAndOffsets) {
  const DType dt = GetParam();
  const int64_t B = 2, Sq = 7, Sk = 11, Hq = 6, Hk = 2, D = 10;
  ops::Buffer q = rand(dt, B * Sq * Hq * D), k = rand(dt, B * Sk * Hk * D), v = rand(dt, B * Sk * Hk * D);
  const DType st = dt == DType::F64 ? DType::F64 : DType::F32;
  for (auto [causal, qo, ko] : std::vector<std::tuple<bool, int64_t, int64_t>>{
           {true, 0, 0}, {true, 5, 0}, {true, 3, 4}, {false, 0, 0}, {true, 0, 100}}) {
    ops::AttentionBlock blk{1.0 / std::sqrt(10.0), causal, qo, ko};
    ops::Buffer o = be->alloc(dt, B * Sq * Hq * D), lse = be->alloc(st, B * Hq * Sq);
    be->attention_fwd(q.view({B, Sq, Hq, D}), k.view({B, Sk, Hk, D}), v.view({B, Sk, Hk, D}), blk,
                      o.view({B, Sq, Hq, D}), lse.flat());
    std::vector<double> ro, rl;
    naive_attention(q.view({B, Sq, Hq, D}), k.view({B, Sk, Hk, D}), v.view({B, Sk, Hk, D}), blk, ro, rl);
    std::vector<double> go(ro.size()), gl;
    for (size_t i = 0; i < ro.size(); ++i) go[i] = val(o.flat(), static_cast<int64_t>(i));
    std::vector<double> rlf;
    for (size_t i = 0; i < rl.size(); ++i) {
      const double x = st == DType::F64 ? lse.flat().ptr<double>()[i] : lse.flat().ptr<float>()[i];
      if (std::isinf(rl[i])) {
        EXPECT_TRUE(std::isinf(x) && x < 0) << "row " << i;
        continue;
      }
      gl.push_back(x);
      rlf.push_back(rl[i]);
    }
    const double tol = dt == DType::F64 ? 1e-12 : 2e-6;
    EXPECT_LT(rel_error(go, ro), tol) << "causal " << causal << " q_offset " << qo << " k_offset " << ko;
    if (!rlf.empty()) { EXPECT_LT(rel_error(gl, rlf), tol); }
  }
}

TEST_P(OpsForward, MergeOfTwoKeyBlocksEqualsOneBlock) {
  const DType dt = GetParam();
  const DType st = dt == DType::F64 ? DType::F64 : DType::F32;
  const int64_t B = 1, S = 13, Hq = 4, Hk = 1, D = 6, split = 5;
  ops::Buffer q = rand(dt, B * S * Hq * D), k = rand(dt, B * S * Hk * D), v = rand(dt, B * S * Hk * D);
  ops::AttentionBlock full{0.4, true, 0, 0};
  ops::Buffer o = be->alloc(dt, q.numel()), l = be->alloc(st, B * Hq * S);
  be->attention_fwd(q.view({B, S, Hq, D}), k.view({B, S, Hk, D}), v.view({B, S, Hk, D}), full, o.view({B, S, Hq, D}),
                    l.flat());
  // Keys [0, split) then [split, S), each a separate block with its k_offset.
  ops::Buffer o1 = be->alloc(dt, q.numel()), l1 = be->alloc(st, B * Hq * S);
  ops::Buffer o2 = be->alloc(dt, q.numel()), l2 = be->alloc(st, B * Hq * S);
  const Tensor k1 = k.view({S, Hk * D}).rows(0, split).reshape({B, split, Hk, D});
  const Tensor v1 = v.view({S, Hk * D}).rows(0, split).reshape({B, split, Hk, D});
  const Tensor k2 = k.view({S, Hk * D}).rows(split, S - split).reshape({B, S - split, Hk, D});
  const Tensor v2 = v.view({S, Hk * D}).rows(split, S - split).reshape({B, S - split, Hk, D});
  be->attention_fwd(q.view({B, S, Hq, D}), k2, v2, {0.4, true, 0, split}, o2.view({B, S, Hq, D}), l2.flat());
  be->attention_fwd(q.view({B, S, Hq, D}), k1, v1, {0.4, true, 0, 0}, o1.view({B, S, Hq, D}), l1.flat());
  be->attention_merge(o1.view({B, S, Hq, D}), l1.flat(), o2.view({B, S, Hq, D}), l2.flat());
  std::vector<double> a(static_cast<size_t>(q.numel())), b(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = val(o1.flat(), static_cast<int64_t>(i));
    b[i] = val(o.flat(), static_cast<int64_t>(i));
  }
  EXPECT_LT(rel_error(a, b), dt == DType::F64 ? 1e-13 : 1e-6);
}

TEST_P(OpsForward, RmsNormRopeSwigluMatchReferences) {
  const DType dt = GetParam();
  const DType st = dt == DType::F64 ? DType::F64 : DType::F32;
  const double tol = dt == DType::F64 ? 1e-13 : 2e-6;
  const int64_t n = 9, d = 37;
  ops::Buffer x = rand(dt, n * d), w = rand(dt, d), y = be->alloc(dt, n * d), r = be->alloc(st, n);
  be->rmsnorm_fwd(x.view({n, d}), w.flat(), 1e-5, y.view({n, d}), r.flat());
  std::vector<double> ref, got;
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += val(x.flat(), i * d + j) * val(x.flat(), i * d + j);
    for (int64_t j = 0; j < d; ++j) {
      ref.push_back(val(w.flat(), j) * val(x.flat(), i * d + j) / std::sqrt(ss / d + 1e-5));
      got.push_back(val(y.flat(), i * d + j));
    }
  }
  EXPECT_LT(rel_error(got, ref), tol);
  // RoPE: HF rotate_half formula, and inverse(forward(x)) == x.
  const int64_t H = 3, hd = 8;
  ops::Buffer q = rand(dt, n * H * hd), q0 = be->alloc(dt, n * H * hd), pos = ints(n, 0, 5000);
  ops::Buffer inv = be->alloc(DType::F32, hd / 2);
  for (int64_t i = 0; i < hd / 2; ++i) inv.flat().ptr<float>()[i] = std::pow(10000.0f, -2.0f * i / hd);
  be->copy(q0.flat(), q.flat());
  be->rope(q.view({n, H, hd}), pos.flat(), inv.flat(), false);
  ref.clear();
  got.clear();
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < hd; ++i) {
        const int64_t base = (t * H + h) * hd, pair = i < hd / 2 ? i + hd / 2 : i - hd / 2;
        const float ang = static_cast<float>(pos.flat().ptr<int32_t>()[t]) * inv.flat().ptr<float>()[i % (hd / 2)];
        const double rot = i < hd / 2 ? -val(q0.flat(), base + pair) : val(q0.flat(), base + pair);
        ref.push_back(val(q0.flat(), base + i) * std::cos(static_cast<double>(ang)) +
                      rot * std::sin(static_cast<double>(ang)));
        got.push_back(val(q.flat(), base + i));
      }
  EXPECT_LT(rel_error(got, ref), tol);
  be->rope(q.view({n, H, hd}), pos.flat(), inv.flat(), true);
  got.clear();
  ref.clear();
  for (int64_t i = 0; i < q.numel(); ++i) {
    got.push_back(val(q.flat(), i));
    ref.push_back(val(q0.flat(), i));
  }
  EXPECT_LT(rel_error(got, ref), tol * 4);
  // SwiGLU.
  ops::Buffer g = rand(dt, 31, -4, 4), u = rand(dt, 31), hh = be->alloc(dt, 31);
  be->swiglu_fwd(g.flat(), u.flat(), hh.flat());
  got.clear();
  ref.clear();
  for (int64_t i = 0; i < 31; ++i) {
    const double gv = val(g.flat(), i);
    ref.push_back(gv / (1 + std::exp(-gv)) * val(u.flat(), i));
    got.push_back(val(hh.flat(), i));
  }
  EXPECT_LT(rel_error(got, ref), tol);
}

TEST_P(OpsForward, LmHeadLossMatchesFullSoftmaxAndIgnoresMinusOne) {
  const DType dt = GetParam();
  const int64_t n = 23, d = 11, V = 53;
  ops::Buffer x = rand(dt, n * d), w = rand(dt, V * d), lab = ints(n, -1, V - 1);
  lab.flat().ptr<int32_t>()[0] = -1;
  double ref = 0;
  int64_t cnt = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t y = lab.flat().ptr<int32_t>()[i];
    if (y < 0) continue;
    std::vector<double> l(static_cast<size_t>(V));
    for (int64_t j = 0; j < V; ++j)
      for (int64_t c = 0; c < d; ++c) l[static_cast<size_t>(j)] += val(x.flat(), i * d + c) * val(w.flat(), j * d + c);
    double mx = *std::max_element(l.begin(), l.end()), s = 0;
    for (double z : l) s += std::exp(z - mx);
    ref += mx + std::log(s) - l[static_cast<size_t>(y)];
    ++cnt;
  }
  for (int64_t tile : {int64_t{1}, int64_t{5}, int64_t{4096}}) {
    ops::LossSums ls = be->lm_head_loss(x.view({n, d}), w.view({V, d}), lab.flat(), tile, 0, Tensor(), Tensor());
    EXPECT_EQ(ls.count, cnt);
    EXPECT_NEAR(ls.sum_nll, ref, std::abs(ref) * (dt == DType::F64 ? 1e-12 : 1e-5)) << "tile " << tile;
  }
}

TEST_P(OpsForward, LmHeadScoreGivesEachRowsNllAndArgmax) {
  const DType dt = GetParam();
  const int64_t n = 29, d = 9, V = 61;
  ops::Buffer x = rand(dt, n * d), w = rand(dt, V * d), lab = ints(n, -1, V - 1);
  auto set = [&](const ops::Buffer& b, int64_t i, double v) {
    if (dt == DType::F64) b.flat().ptr<double>()[i] = v;
    else b.flat().ptr<float>()[i] = static_cast<float>(v);
  };
  // Rows 0 and 1 see logits tied at their maximum (w rows 5 and 9 equal, everything else
  // smaller): the first index wins, as torch.argmax.
  for (int64_t c = 0; c < d; ++c) {
    set(w, 5 * d + c, c == 0 ? 3.0 : 0.0);
    set(w, 9 * d + c, c == 0 ? 3.0 : 0.0);
    for (int64_t r : {0, 1}) set(x, r * d + c, c == 0 ? 1.0 : 0.0);
  }
  int32_t* y = lab.flat().ptr<int32_t>();
  y[0] = 5;
  y[1] = 9;
  y[2] = -1;
  // Half the other rows get their argmax as the label.
  std::vector<std::vector<double>> logits(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(V)));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < V; ++j)
      for (int64_t c = 0; c < d; ++c)
        logits[static_cast<size_t>(i)][static_cast<size_t>(j)] += val(x.flat(), i * d + c) * val(w.flat(), j * d + c);
  for (int64_t i = 3; i < n; i += 2) {
    const auto& l = logits[static_cast<size_t>(i)];
    y[i] = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  }
  for (int64_t tile : {int64_t{1}, int64_t{4}, int64_t{4096}}) {
    std::vector<double> nll(static_cast<size_t>(n), -1);
    std::vector<int32_t> top(static_cast<size_t>(n), -1);
    be->lm_head_score(x.view({n, d}), w.view({V, d}), lab.flat(), tile, Tensor(nll.data(), DType::F64, {n}),
                      Tensor(top.data(), DType::I32, {n}));
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto& l = logits[static_cast<size_t>(i)];
      if (y[i] < 0) {
        EXPECT_EQ(nll[static_cast<size_t>(i)], 0.0);
        EXPECT_EQ(top[static_cast<size_t>(i)], 0);
        continue;
      }
      const double mx = *std::max_element(l.begin(), l.end());
      double s = 0;
      for (double z : l) s += std::exp(z - mx);
      const double ref = mx + std::log(s) - l[static_cast<size_t>(y[i])];
      EXPECT_NEAR(nll[static_cast<size_t>(i)], ref, 1e-5 * std::max(1.0, std::abs(ref))) << "row " << i;
      const int32_t want = (std::max_element(l.begin(), l.end()) - l.begin()) == y[i] ? 1 : 0;
      EXPECT_EQ(top[static_cast<size_t>(i)], want) << "row " << i << " tile " << tile;
      sum += nll[static_cast<size_t>(i)];
    }
    EXPECT_EQ(top[0], 1);
    EXPECT_EQ(top[1], 0);
    // The same bits as lm_head_loss's sum (one row at a time, in order).
    const ops::LossSums ls = be->lm_head_loss(x.view({n, d}), w.view({V, d}), lab.flat(), tile, 0, Tensor(), Tensor());
    EXPECT_EQ(ls.sum_nll, sum) << "tile " << tile;
  }
  std::vector<double> nll(1);
  std::vector<int32_t> top(1);
  EXPECT_THROW(be->lm_head_score(x.view({n, d}), w.view({V, d}), lab.flat(), 4, Tensor(nll.data(), DType::F64, {1}),
                                 Tensor(top.data(), DType::I32, {1})),
               Error);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, OpsForward, ::testing::Values(DType::F32, DType::F64));

TEST_F(OpsFixture, AdamWMatchesPyTorchFormula) {
  const int64_t n = 257;
  ops::Buffer p = rand(DType::F32, n), m = be->alloc(DType::F32, n), v = be->alloc(DType::F32, n);
  std::vector<double> rp(static_cast<size_t>(n)), rm(rp.size()), rv(rp.size());
  for (int64_t i = 0; i < n; ++i) rp[static_cast<size_t>(i)] = p.flat().ptr<float>()[i];
  ops::AdamWStep s{1e-2, 0.9, 0.95, 1e-8, 0.1, 1};
  for (int64_t step = 1; step <= 3; ++step) {
    s.step = step;
    ops::Buffer g = rand(DType::F32, n);
    be->adamw(p.flat(), g.flat(), m.flat(), v.flat(), s);
    for (int64_t i = 0; i < n; ++i) {
      const size_t j = static_cast<size_t>(i);
      const double gi = g.flat().ptr<float>()[i];
      rp[j] *= 1 - s.lr * s.weight_decay;
      rm[j] = 0.9 * rm[j] + 0.1 * gi;
      rv[j] = 0.95 * rv[j] + 0.05 * gi * gi;
      rp[j] -= s.lr * (rm[j] / (1 - std::pow(0.9, step))) / (std::sqrt(rv[j] / (1 - std::pow(0.95, step))) + 1e-8);
    }
  }
  std::vector<double> got(rp.size());
  for (int64_t i = 0; i < n; ++i) got[static_cast<size_t>(i)] = p.flat().ptr<float>()[i];
  EXPECT_LT(rel_error(got, rp), 1e-6);
}

// The exact bits of float -> bf16 at the edges: ties to even, carry into the exponent, overflow
// to infinity, infinities, and NaNs (quiet, sign kept, never rounded into infinity).
TEST(Bf16, RoundsToNearestEvenAndKeepsNaN) {
  const std::vector<std::pair<uint32_t, uint16_t>> cases = {
      {0x3f800000u, 0x3f80u}, {0x3f808000u, 0x3f80u}, {0x3f818000u, 0x3f82u}, {0x3f808001u, 0x3f81u},
      {0x3f7fffffu, 0x3f80u}, {0x7f7fffffu, 0x7f80u}, {0x7f800000u, 0x7f80u}, {0xff800000u, 0xff80u},
      {0x7fc00000u, 0x7fc0u}, {0x7f800001u, 0x7fc0u}, {0x7fffffffu, 0x7fffu}, {0xffc00001u, 0xffc0u},
      {0x00000001u, 0x0000u}, {0x80000000u, 0x8000u}, {0x00008000u, 0x0000u}, {0x00018000u, 0x0002u}};
  for (const auto& [in, want] : cases) {
    float f;
    std::memcpy(&f, &in, 4);
    EXPECT_EQ(ops::float_to_bf16(f), want) << std::hex << in;
  }
}

TEST_F(OpsFixture, Bf16AndF16RoundTripAndSumSquares) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.14159f, 1e-3f, 65504.0f, 6.1e-5f, 3e-7f}) {
    EXPECT_NEAR(ops::bf16_to_float(ops::float_to_bf16(f)), f, std::abs(f) * 4e-3 + 1e-30) << f;
    EXPECT_NEAR(ops::f16_to_float(ops::float_to_f16(f)), f, std::abs(f) * 1e-3 + 6e-8) << f;
  }
  ops::Buffer x = rand(DType::F64, 100001);
  double ref = 0;
  for (int64_t i = 0; i < x.numel(); ++i) ref += x.flat().ptr<double>()[i] * x.flat().ptr<double>()[i];
  EXPECT_NEAR(be->sum_squares(x.flat()), ref, ref * 1e-12);
  EXPECT_EQ(be->sum_squares(x.flat()), be->sum_squares(x.flat()));  // deterministic
}

TEST_F(OpsFixture, ShapeErrorsNameTheOp) {
  ops::Buffer a = rand(DType::F32, 12), b = rand(DType::F32, 12), c = be->alloc(DType::F32, 9);
  try {
    be->matmul(a.view({3, 4}), false, b.view({3, 4}), false, c.view({3, 3}));
    FAIL() << "no error";
  } catch (const Error& e) { EXPECT_NE(std::string(e.what()).find("matmul"), std::string::npos) << e.what(); }
  ops::Buffer ids = ints(3, 0, 2);
  ids.flat().ptr<int32_t>()[1] = 99;
  EXPECT_THROW(be->embedding_fwd(ids.flat(), a.view({3, 4}), b.view({3, 4})), Error);
}

}  // namespace
}  // namespace easyctx::test

namespace easyctx::test {
namespace {

// attention_bwd with blk.accumulate false overwrites dq/dk/dv (LocalAttention's call): the
// same values as accumulating onto zeros, whatever the buffers held.
TEST_F(OpsFixture, AttentionBackwardOverwriteEqualsAccumulateFromZero) {
  const int64_t S = 37, H = 4, Hk = 2, hd = 8;
  for (bool causal : {true, false}) {
    ops::Buffer q = rand(DType::F32, S * H * hd), k = rand(DType::F32, S * Hk * hd), v = rand(DType::F32, S * Hk * hd);
    ops::Buffer o = be->alloc(DType::F32, S * H * hd), lse = be->alloc(DType::F32, H * S);
    ops::Buffer dout = rand(DType::F32, S * H * hd);
    ops::AttentionBlock blk;
    blk.scale = 0.35;
    blk.causal = causal;
    auto qv = [&](const ops::Buffer& b) { return b.view({1, S, H, hd}); };
    auto kv = [&](const ops::Buffer& b) { return b.view({1, S, Hk, hd}); };
    be->attention_fwd(qv(q), kv(k), kv(v), blk, qv(o), lse.flat());
    ops::Buffer a[3] = {be->alloc(DType::F32, S * H * hd), be->alloc(DType::F32, S * Hk * hd),
                        be->alloc(DType::F32, S * Hk * hd)};
    ops::Buffer w[3] = {rand(DType::F32, S * H * hd, 5, 9), rand(DType::F32, S * Hk * hd, 5, 9),
                        rand(DType::F32, S * Hk * hd, 5, 9)};  // garbage the overwrite must not keep
    be->attention_bwd(qv(q), kv(k), kv(v), qv(o), lse.flat(), qv(dout), blk, qv(a[0]), kv(a[1]), kv(a[2]));
    blk.accumulate = false;
    be->attention_bwd(qv(q), kv(k), kv(v), qv(o), lse.flat(), qv(dout), blk, qv(w[0]), kv(w[1]), kv(w[2]));
    for (int i = 0; i < 3; ++i)
      for (int64_t j = 0; j < a[i].numel(); ++j)
        ASSERT_EQ(a[i].flat().ptr<float>()[j], w[i].flat().ptr<float>()[j]) << "tensor " << i << " element " << j;
  }
}

// copy_2d: rows of `width` elements between two pitches (f32 and bf16), the rest of the
// destination untouched; arguments that would read or write past a view are refused.
TEST_F(OpsFixture, Copy2dMovesStridedRowsOnly) {
  const int64_t rows = 7, width = 5, sp = 11, dp = 8;
  for (DType t : {DType::F32, DType::BF16}) {
    ops::Buffer src = rand(DType::F32, rows * sp), dst = rand(DType::F32, rows * dp + 3, 5, 9);
    ops::Buffer s2 = be->alloc(t, src.numel()), d2 = be->alloc(t, dst.numel());
    be->copy(s2.flat(), src.flat());
    be->copy(d2.flat(), dst.flat());
    std::vector<uint16_t> before(static_cast<size_t>(d2.bytes() / 2));
    std::memcpy(before.data(), d2.data(), d2.bytes());
    // from column 3 of src into column 2 of dst
    be->copy_2d(d2.flat().slice_flat(2, {d2.numel() - 2}), dp, s2.flat().slice_flat(3, {s2.numel() - 3}), sp, rows,
                width);
    const size_t es = ops::element_size(t);
    const auto* d = static_cast<const char*>(d2.data());
    const auto* s = static_cast<const char*>(s2.data());
    const auto* b = reinterpret_cast<const char*>(before.data());
    for (int64_t i = 0; i < d2.numel(); ++i) {
      const int64_t r = i / dp, col = i % dp;
      const bool copied = r < rows && col >= 2 && col < 2 + width;
      const char* want = copied ? s + static_cast<size_t>(r * sp + 3 + col - 2) * es : b + static_cast<size_t>(i) * es;
      ASSERT_EQ(std::memcmp(d + static_cast<size_t>(i) * es, want, es), 0)
          << ops::type_name(t) << " element " << i << (copied ? " (copied)" : " (untouched)");
    }
    EXPECT_THROW(be->copy_2d(d2.flat(), dp, s2.flat(), sp, rows + 1, width), Error);  // src too short
    EXPECT_THROW(be->copy_2d(d2.flat(), 4, s2.flat(), sp, 2, width), Error);          // width > pitch
  }
  ops::Buffer f = rand(DType::F32, 16), h = be->alloc(DType::BF16, 16);
  EXPECT_THROW(be->copy_2d(h.flat(), 4, f.flat(), 4, 4, 4), Error);  // dtypes differ
}

// The CPU backend's large buffers (the host optimizer's fp32 state, 91 GB for a 7.6B model)
// come zeroed and already resident: first touched when allocated, by every thread, so that
// neither the first steps nor the loading fault them in page by page (the resident set grows
// by the buffer as it is allocated); small ones are zeroed too.
TEST(CpuBackend, LargeBuffersComeZeroedAndResident) {
  auto be = ops::make_cpu_backend();
  const auto resident = [] {
    std::ifstream f("/proc/self/statm");
    int64_t size = 0, pages = 0;
    f >> size >> pages;
    return pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  };
  const int64_t n = (int64_t{256} << 20) / 4 + 3;  // 256 MiB and a bit: a large buffer
  const int64_t before = resident();
  ops::Buffer b = be->alloc(DType::F32, n);
  const int64_t grew = resident() - before;
  EXPECT_GE(grew, 4 * n * 9 / 10) << "resident before: " << before << " bytes";
  const float* p = b.flat().ptr<float>();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(p[i], 0.0f) << i;
  EXPECT_EQ(p[n - 1], 0.0f);
  ops::Buffer small = be->alloc(DType::F32, 1000);
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(small.flat().ptr<float>()[i], 0.0f) << i;
}

}  // namespace
}  // namespace easyctx::test
