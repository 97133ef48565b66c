// Every op's backward against central finite differences in fp64, on random odd shapes.
// Each check uses L = <forward(inputs), R> with a fresh random R, so dout = R.
#include <cmath>

#include "ops_test_util.h"

namespace easyctx::test {
namespace {

using ops::DType;
using ops::Tensor;
constexpr DType F64 = DType::F64;
constexpr double kTol = 1e-6;

TEST_F(OpsFixture, GradRmsNorm) {
  const int64_t n = 5, d = 13;
  ops::Buffer x = rand(F64, n * d), w = rand(F64, d), y = be->alloc(F64, n * d), r = be->alloc(F64, n);
  ops::Buffer R = rand(F64, n * d), dx = be->alloc(F64, n * d), dw = be->alloc(F64, d);
  auto f = [&] {
    be->rmsnorm_fwd(x.view({n, d}), w.flat(), 1e-5, y.view({n, d}), r.flat());
    return dot(y.flat(), R.flat());
  };
  f();
  be->rmsnorm_bwd(x.view({n, d}), w.flat(), r.flat(), R.view({n, d}), dx.view({n, d}), dw.flat());
  EXPECT_LT(fd_check(x.flat().ptr<double>(), dx.flat().ptr<double>(), n * d, f, rng), kTol);
  EXPECT_LT(fd_check(w.flat().ptr<double>(), dw.flat().ptr<double>(), d, f, rng), kTol);
}

TEST_F(OpsFixture, GradRope) {
  const int64_t n = 7, H = 3, hd = 10;
  ops::Buffer x = rand(F64, n * H * hd), y = be->alloc(F64, n * H * hd), R = rand(F64, n * H * hd);
  ops::Buffer pos = ints(n, 0, 900), inv = be->alloc(DType::F32, hd / 2), dx = be->alloc(F64, n * H * hd);
  for (int64_t i = 0; i < hd / 2; ++i) inv.flat().ptr<float>()[i] = std::pow(500.0f, -2.0f * i / hd);
  auto f = [&] {
    be->copy(y.flat(), x.flat());
    be->rope(y.view({n, H, hd}), pos.flat(), inv.flat(), false);
    return dot(y.flat(), R.flat());
  };
  be->copy(dx.flat(), R.flat());
  be->rope(dx.view({n, H, hd}), pos.flat(), inv.flat(), true);  // backward of a rotation
  EXPECT_LT(fd_check(x.flat().ptr<double>(), dx.flat().ptr<double>(), x.numel(), f, rng), kTol);
}

TEST_F(OpsFixture, GradSwiglu) {
  const int64_t n = 29;
  ops::Buffer g = rand(F64, n, -3, 3), u = rand(F64, n), h = be->alloc(F64, n), R = rand(F64, n);
  ops::Buffer dg = be->alloc(F64, n), du = be->alloc(F64, n);
  auto f = [&] {
    be->swiglu_fwd(g.flat(), u.flat(), h.flat());
    return dot(h.flat(), R.flat());
  };
  be->swiglu_bwd(g.flat(), u.flat(), R.flat(), dg.flat(), du.flat());
  EXPECT_LT(fd_check(g.flat().ptr<double>(), dg.flat().ptr<double>(), n, f, rng), kTol);
  EXPECT_LT(fd_check(u.flat().ptr<double>(), du.flat().ptr<double>(), n, f, rng), kTol);
}

TEST_F(OpsFixture, GradEmbeddingWithRepeatedIds) {
  const int64_t n = 11, V = 5, d = 7;
  ops::Buffer ids = ints(n, 0, V - 1), t = rand(F64, V * d), out = be->alloc(F64, n * d), R = rand(F64, n * d);
  ops::Buffer dt = be->alloc(F64, V * d);
  auto f = [&] {
    be->embedding_fwd(ids.flat(), t.view({V, d}), out.view({n, d}));
    return dot(out.flat(), R.flat());
  };
  be->embedding_bwd(ids.flat(), R.view({n, d}), dt.view({V, d}));
  EXPECT_LT(fd_check(t.flat().ptr<double>(), dt.flat().ptr<double>(), V * d, f, rng, 35), kTol);
}

TEST_F(OpsFixture, GradMatmulAllTransposes) {
  // The model's backward uses matmul itself; check d<op(A)op(B), R> for every layout.
  const int64_t m = 5, n = 7, k = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      ops::Buffer a = rand(F64, m * k), b = rand(F64, k * n), c = be->alloc(F64, m * n), R = rand(F64, m * n);
      const Tensor av = ta ? a.view({k, m}) : a.view({m, k}), bv = tb ? b.view({n, k}) : b.view({k, n});
      auto f = [&] {
        be->matmul(av, ta, bv, tb, c.view({m, n}));
        return dot(c.flat(), R.flat());
      };
      // dA = R op(B)^T (then transposed back if ta), dB likewise.
      ops::Buffer da = be->alloc(F64, m * k), db = be->alloc(F64, k * n);
      if (!ta) be->matmul(R.view({m, n}), false, bv, !tb, da.view({m, k}));
      else be->matmul(bv, tb, R.view({m, n}), true, da.view({k, m}));
      if (!tb) be->matmul(av, !ta, R.view({m, n}), false, db.view({k, n}));
      else be->matmul(R.view({m, n}), true, av, ta, db.view({n, k}));
      EXPECT_LT(fd_check(a.flat().ptr<double>(), da.flat().ptr<double>(), m * k, f, rng), kTol) << ta << tb;
      EXPECT_LT(fd_check(b.flat().ptr<double>(), db.flat().ptr<double>(), k * n, f, rng), kTol) << ta << tb;
    }
}

TEST_F(OpsFixture, GradAttentionGqaCausalWithOffsets) {
  const int64_t B = 2, Sq = 5, Sk = 6, Hq = 4, Hk = 2, D = 3;
  for (auto [causal, qo, ko] :
       std::vector<std::tuple<bool, int64_t, int64_t>>{{true, 0, 0}, {true, 4, 2}, {false, 0, 0}}) {
    ops::Buffer q = rand(F64, B * Sq * Hq * D), k = rand(F64, B * Sk * Hk * D), v = rand(F64, B * Sk * Hk * D);
    ops::Buffer o = be->alloc(F64, q.numel()), l = be->alloc(F64, B * Hq * Sq), R = rand(F64, q.numel());
    ops::Buffer dq = be->alloc(F64, q.numel()), dk = be->alloc(F64, k.numel()), dv = be->alloc(F64, v.numel());
    const ops::AttentionBlock blk{0.7, causal, qo, ko};
    auto qv = q.view({B, Sq, Hq, D}), kv = k.view({B, Sk, Hk, D}), vv = v.view({B, Sk, Hk, D});
    auto f = [&] {
      be->attention_fwd(qv, kv, vv, blk, o.view({B, Sq, Hq, D}), l.flat());
      return dot(o.flat(), R.flat());
    };
    f();
    be->attention_bwd(qv, kv, vv, o.view({B, Sq, Hq, D}), l.flat(), R.view({B, Sq, Hq, D}), blk,
                      dq.view({B, Sq, Hq, D}), dk.view({B, Sk, Hk, D}), dv.view({B, Sk, Hk, D}));
    EXPECT_LT(fd_check(q.flat().ptr<double>(), dq.flat().ptr<double>(), q.numel(), f, rng, 30), kTol);
    EXPECT_LT(fd_check(k.flat().ptr<double>(), dk.flat().ptr<double>(), k.numel(), f, rng, 30), kTol);
    EXPECT_LT(fd_check(v.flat().ptr<double>(), dv.flat().ptr<double>(), v.numel(), f, rng, 30), kTol);
  }
}

TEST_F(OpsFixture, GradAttentionSplitIntoBlocksSumsToFull) {
  // Ring-style backward: with the merged o/lse, per-block backward contributions add up to
  // the single-block gradients.
  const int64_t B = 1, S = 9, Hq = 2, Hk = 1, D = 4, split = 4;
  ops::Buffer q = rand(F64, B * S * Hq * D), k = rand(F64, B * S * Hk * D), v = rand(F64, B * S * Hk * D);
  ops::Buffer o = be->alloc(F64, q.numel()), l = be->alloc(F64, B * Hq * S), R = rand(F64, q.numel());
  const ops::AttentionBlock full{0.5, true, 0, 0};
  auto qv = q.view({B, S, Hq, D});
  be->attention_fwd(qv, k.view({B, S, Hk, D}), v.view({B, S, Hk, D}), full, o.view({B, S, Hq, D}), l.flat());
  ops::Buffer dq = be->alloc(F64, q.numel()), dk = be->alloc(F64, k.numel()), dv = be->alloc(F64, v.numel());
  be->attention_bwd(qv, k.view({B, S, Hk, D}), v.view({B, S, Hk, D}), o.view({B, S, Hq, D}), l.flat(),
                    R.view({B, S, Hq, D}), full, dq.view({B, S, Hq, D}), dk.view({B, S, Hk, D}),
                    dv.view({B, S, Hk, D}));
  ops::Buffer dq2 = be->alloc(F64, q.numel()), dk2 = be->alloc(F64, k.numel()), dv2 = be->alloc(F64, v.numel());
  for (auto [k0, kn] : std::vector<std::pair<int64_t, int64_t>>{{0, split}, {split, S - split}}) {
    auto ks = k.view({S, Hk * D}).rows(k0, kn).reshape({B, kn, Hk, D});
    auto vs = v.view({S, Hk * D}).rows(k0, kn).reshape({B, kn, Hk, D});
    auto dks = dk2.view({S, Hk * D}).rows(k0, kn).reshape({B, kn, Hk, D});
    auto dvs = dv2.view({S, Hk * D}).rows(k0, kn).reshape({B, kn, Hk, D});
    be->attention_bwd(qv, ks, vs, o.view({B, S, Hq, D}), l.flat(), R.view({B, S, Hq, D}), {0.5, true, 0, k0},
                      dq2.view({B, S, Hq, D}), dks, dvs);
  }
  auto vec = [](const ops::Buffer& b) {
    return std::vector<double>(b.flat().ptr<double>(), b.flat().ptr<double>() + b.numel());
  };
  EXPECT_LT(rel_error(vec(dq2), vec(dq)), 1e-13);
  EXPECT_LT(rel_error(vec(dk2), vec(dk)), 1e-13);
  EXPECT_LT(rel_error(vec(dv2), vec(dv)), 1e-13);
}

TEST_F(OpsFixture, GradLmHeadLossTiled) {
  const int64_t n = 9, d = 5, V = 17;
  ops::Buffer x = rand(F64, n * d), w = rand(F64, V * d), lab = ints(n, -1, V - 1);
  lab.flat().ptr<int32_t>()[2] = -1;
  const double scale = 0.37;
  for (int64_t tile : {int64_t{2}, int64_t{100}}) {
    ops::Buffer dx = be->alloc(F64, n * d), dw = rand(F64, V * d), dw0 = be->alloc(F64, V * d);
    be->copy(dw0.flat(), dw.flat());  // dw accumulates onto what is there
    auto f = [&] {
      return scale * be->lm_head_loss(x.view({n, d}), w.view({V, d}), lab.flat(), tile, 0, Tensor(), Tensor()).sum_nll;
    };
    be->lm_head_loss(x.view({n, d}), w.view({V, d}), lab.flat(), tile, scale, dx.view({n, d}), dw.view({V, d}));
    be->axpy(dw.flat(), dw0.flat(), -1.0);
    EXPECT_LT(fd_check(x.flat().ptr<double>(), dx.flat().ptr<double>(), n * d, f, rng), kTol) << tile;
    EXPECT_LT(fd_check(w.flat().ptr<double>(), dw.flat().ptr<double>(), V * d, f, rng), kTol) << tile;
    for (int64_t c = 0; c < d; ++c) EXPECT_EQ(dx.flat().ptr<double>()[2 * d + c], 0.0);  // ignored row
  }
}

}  // namespace
}  // namespace easyctx::test
