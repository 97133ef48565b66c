// Every non-attention op of the CUDA backend against the CPU reference, for f32 and bf16
// storage, on fresh random inputs with odd shapes; outputs are NaN-poisoned first, so an
// element the kernel forgot fails the comparison. Tolerances (relative norm error): f32
// 1e-5, bf16 1e-2 (the reference runs in fp32 on the same bf16-rounded inputs).
#include <algorithm>
#include <functional>

#include "cuda_test_util.h"

namespace easyctx::test {
namespace {

const DType kTypes[] = {DType::F32, DType::BF16};

// The elementwise kernels take 16-byte vector paths when D or n allows and the pointers are
// aligned, scalar ones otherwise; the cases below cover both (upload_padded with off = 1
// misaligns every view by one element).

TEST_F(CudaOpsTest, CopyConvertsAndRoundTrips) {
  const int64_t n = 10007;
  auto x = random_vector<float>(n, rng, -3, 3);
  Buffer b = upload(x, DType::BF16);         // host f32 -> device bf16 (device conversion)
  auto back = download(b);                   // device bf16 -> host f32
  EXPECT_EQ(back, rounded(x, DType::BF16));  // same round-to-nearest-even as the host helper
  Buffer f = gpu->alloc(DType::F32, n);
  poison(f);
  gpu->copy(f.flat(), b.flat());  // device bf16 -> device f32
  EXPECT_EQ(download(f), back);
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  Tensor hb(bits.data(), DType::BF16, {n});
  gpu->copy(hb, f.flat());  // device f32 -> host bf16
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(bits[static_cast<size_t>(i)], ops::float_to_bf16(back[static_cast<size_t>(i)]));
}

// copy_async on the copy stream against the compute stream, on 64 MiB so that a missing
// dependency shows: a copy out sees the fill queued before it and not the one queued after
// its wait_copy; a copy in lands before the axpy queued after its wait_copy.
TEST_F(CudaOpsTest, CopyAsyncIsOrderedByFences) {
  const int64_t n = int64_t{1} << 24;
  Buffer d1 = gpu->alloc(DType::F32, n), d2 = gpu->alloc(DType::F32, n);
  Buffer h = gpu->alloc_host_pinned(DType::F32, n);
  for (int round = 0; round < 3; ++round) {
    const float a = 3.0f + static_cast<float>(round);
    gpu->fill(d1.flat(), a);
    const ops::CopyFence out = gpu->copy_async(h.flat(), d1.flat());  // after the fill
    gpu->wait_copy(out);
    gpu->fill(d1.flat(), 5.0);  // after the copy out: must not reach h
    const ops::CopyFence in = gpu->copy_async(d2.flat(), h.flat());
    gpu->wait_copy(in);
    gpu->axpy(d2.flat(), d1.flat(), 1.0);  // a + 5
    gpu->synchronize();
    const float* hp = h.flat().ptr<float>();
    for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(hp[i], a) << "round " << round << " element " << i;
    ASSERT_EQ(hp[n - 1], a);
    const std::vector<float> got = download(d2);
    for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(got[static_cast<size_t>(i)], a + 5.0f) << "element " << i;
    ASSERT_EQ(got.back(), a + 5.0f);
  }
  EXPECT_GT(gpu->copy_async(h.flat().slice_flat(0, {0}), d1.flat().slice_flat(0, {0})).seq,
            0);                                             // empty: a fence all the same
  gpu->wait_copy({});                                       // the empty fence: nothing to wait for
  EXPECT_THROW(gpu->wait_copy({int64_t{1} << 40}), Error);  // never issued
}

// copy_2d on the device (one cudaMemcpy2DAsync): heads 2..4 of a bf16 [37, 6 x 24] array
// packed into [37, 3 x 24] and back into a poisoned copy, against the same packing on the host.
TEST_F(CudaOpsTest, Copy2dPacksHeads) {
  const int64_t rows = 37, H = 6, hd = 24, h0 = 2, h = 3;
  const auto x = rounded(random_vector<float>(rows * H * hd, rng, -3, 3), DType::BF16);
  Buffer src = upload(x, DType::BF16), packed = gpu->alloc(DType::BF16, rows * h * hd);
  poison(packed);
  gpu->copy_2d(packed.flat(), h * hd, src.flat().slice_flat(h0 * hd, {rows * H * hd - h0 * hd}), H * hd, rows, h * hd);
  std::vector<float> want;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < h * hd; ++i) want.push_back(x[static_cast<size_t>(r * H * hd + h0 * hd + i)]);
  EXPECT_EQ(download(packed), want);
  Buffer back = gpu->alloc(DType::BF16, rows * H * hd);
  poison(back);
  gpu->copy_2d(back.flat().slice_flat(h0 * hd, {rows * H * hd - h0 * hd}), H * hd, packed.flat(), h * hd, rows, h * hd);
  const std::vector<float> got = download(back);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < H * hd; ++i) {
      const float g = got[static_cast<size_t>(r * H * hd + i)];
      if (i >= h0 * hd && i < (h0 + h) * hd) ASSERT_EQ(g, x[static_cast<size_t>(r * H * hd + i)]) << r << "," << i;
      else ASSERT_TRUE(std::isnan(g)) << "element " << r << "," << i << " outside the heads was written";
    }
  EXPECT_THROW(gpu->copy_2d(packed.flat(), h * hd, src.flat(), H * hd, rows + 1, h * hd), Error);
}

TEST_F(CudaOpsTest, FillAxpyScaleSumSquares) {
  for (DType t : kTypes) {
    SCOPED_TRACE(ops::type_name(t));
    tag = ops::type_name(t);
    const int64_t n = 100003;  // groups of 8 and a tail of 3
    auto y = rand(n, t), x = rand(n, t);
    Buffer by = upload(y, t), bx = upload(x, t);
    gpu->axpy(by.flat(), bx.flat(), -0.37);
    cpu->axpy(host(y, {n}), host(x, {n}), -0.37);
    EXPECT_REL(download(by), y, tol(t));
    {  // x misaligned by one element: the scalar path
      auto y2 = rand(n - 1, t);
      Buffer by2 = upload(y2, t);
      gpu->axpy(by2.flat(), bx.flat().slice_flat(1, {n - 1}), 0.61);
      std::vector<float> x_tail(x.begin() + 1, x.end());
      cpu->axpy(host(y2, {n - 1}), host(x_tail, {n - 1}), 0.61);
      EXPECT_REL(download(by2), y2, tol(t));
    }
    y = rounded(download(by), t);
    gpu->scale(by.flat(), 1.7);
    cpu->scale(host(y, {n}), 1.7);
    EXPECT_REL(download(by), y, tol(t));
    y = download(by);
    const double ss = gpu->sum_squares(by.flat());
    const double ref = cpu->sum_squares(host(y, {n}));
    EXPECT_NEAR(ss, ref, 1e-6 * ref);
    EXPECT_EQ(ss, gpu->sum_squares(by.flat()));  // fixed reduction order
    gpu->fill(by.flat(), 0.25);
    for (float v : download(by)) ASSERT_EQ(v, 0.25f);
  }
}

TEST_F(CudaOpsTest, Embedding) {
  for (DType t : kTypes) {
    SCOPED_TRACE(ops::type_name(t));
    tag = ops::type_name(t);
    const int64_t vocab = 301, d = 77, n = 517;
    std::vector<int32_t> ids(static_cast<size_t>(n));
    std::uniform_int_distribution<int32_t> pick(0, 40);  // few distinct ids: many repeats
    for (auto& i : ids) i = pick(rng) * 7;
    auto table = rand(vocab * d, t), dout = rand(n * d, t), dtable = rand(vocab * d, t);
    Buffer bids = upload_i32(ids), btable = upload(table, t), bout = gpu->alloc(t, n * d), bdout = upload(dout, t);
    Buffer bdtable = upload(dtable, t);
    poison(bout);
    gpu->embedding_fwd(bids.flat(), btable.view({vocab, d}), bout.view({n, d}));
    std::vector<float> out(static_cast<size_t>(n * d));
    cpu->embedding_fwd(host_i32(ids, {n}), host(table, {vocab, d}), host(out, {n, d}));
    EXPECT_EQ(download(bout), out);  // a gather: exact
    gpu->embedding_bwd(bids.flat(), bdout.view({n, d}), bdtable.view({vocab, d}));
    auto first = download(bdtable);
    cpu->embedding_bwd(host_i32(ids, {n}), host(dout, {n, d}), host(dtable, {vocab, d}));
    EXPECT_REL(first, dtable, tol(t));
    // Deterministic: the same accumulation again from the same start is bit-identical.
    Buffer again = upload(rounded(dtable, t), t);
    Buffer again2 = upload(rounded(dtable, t), t);
    gpu->embedding_bwd(bids.flat(), bdout.view({n, d}), again.view({vocab, d}));
    gpu->embedding_bwd(bids.flat(), bdout.view({n, d}), again2.view({vocab, d}));
    EXPECT_EQ(download(again), download(again2));
  }
  std::vector<int32_t> bad{0, 301};
  Buffer bids = upload_i32(bad), table = gpu->alloc(DType::F32, 301 * 8), out = gpu->alloc(DType::F32, 16);
  EXPECT_THROW(gpu->embedding_fwd(bids.flat(), table.view({301, 8}), out.view({2, 8})), Error);
}

TEST_F(CudaOpsTest, RmsNorm) {
  struct Case {
    int64_t n, d, off;
  };
  // d = 333 and 16384: scalar kernels; 2048 / 4096 / 5120: 1, 2, 3 groups of 8 per thread;
  // n = 131 / 70 / 67: a last chunk of the dw partials shorter than 64 rows; off 1: misaligned.
  // Narrow rows (d <= 256: a lane group per row or chunk): d = 64 / 120 / 128 / 256 take 8 / 16 /
  // 16 / 32 lanes (120: one lane of 16 idle), n = 1000 and 77 end in a short chunk and a block
  // part past the last chunk; n = 70001 at d 128 makes 1,094 chunks: the segmented column sum.
  const Case cases[] = {{131, 333, 0},  {70, 2048, 0}, {33, 4096, 0}, {67, 5120, 0}, {9, 16384, 0},   {70, 2048, 1},
                        {1000, 128, 0}, {77, 64, 0},   {50, 120, 0},  {130, 256, 0}, {70001, 128, 0}, {70, 128, 1}};
  for (DType t : kTypes) {
    for (const Case& c : cases) {
      const int64_t n = c.n, d = c.d;
      tag = std::string(ops::type_name(t)) + " n=" + std::to_string(n) + " d=" + std::to_string(d) +
            " off=" + std::to_string(c.off);
      SCOPED_TRACE(tag);
      auto pad = [&](const std::vector<float>& v) { return upload_padded(v, t, c.off); };
      auto x = rand(n * d, t, -2, 2), w = rand(d, t, 0.5, 1.5), dy = rand(n * d, t), dx = rand(n * d, t),
           dw = rand(d, t);
      Padded bx = pad(x), by = pad(std::vector<float>(static_cast<size_t>(n * d)));
      Buffer bw = upload(w, t), br = gpu->alloc(DType::F32, n);
      poison(by.buf);
      poison(br);
      gpu->rmsnorm_fwd(bx.view({n, d}), bw.flat(), 1e-5, by.view({n, d}), br.flat());
      std::vector<float> y(static_cast<size_t>(n * d)), r(static_cast<size_t>(n));
      cpu->rmsnorm_fwd(host(x, {n, d}), host(w, {d}), 1e-5, host(y, {n, d}), host(r, {n}));
      EXPECT_REL(download(by), y, tol(t));
      EXPECT_REL(download(br), r, 1e-5);
      Padded bdy = pad(dy), bdx = pad(dx), bdx_again = pad(dx);
      Buffer bdw = upload(dw, t), bdw_again = upload(dw, t);
      gpu->rmsnorm_bwd(bx.view({n, d}), bw.flat(), br.flat(), bdy.view({n, d}), bdx.view({n, d}), bdw.flat());
      // Deterministic: the same call again gives the same bits (dw's ordered partial sums too).
      gpu->rmsnorm_bwd(bx.view({n, d}), bw.flat(), br.flat(), bdy.view({n, d}), bdx_again.view({n, d}),
                       bdw_again.flat());
      EXPECT_EQ(download(bdx), download(bdx_again));
      EXPECT_EQ(download(bdw), download(bdw_again));
      cpu->rmsnorm_bwd(host(x, {n, d}), host(w, {d}), host(r, {n}), host(dy, {n, d}), host(dx, {n, d}), host(dw, {d}));
      EXPECT_REL(download(bdx), dx, tol(t));
      EXPECT_REL(download(bdw), dw, tol(t));
      // Without dw (the backend skips the partials): dx alone, same values.
      Padded bdx2 = pad(rounded(dx, t));
      auto dx2 = rounded(dx, t);
      gpu->rmsnorm_bwd(bx.view({n, d}), bw.flat(), br.flat(), bdy.view({n, d}), bdx2.view({n, d}), Tensor());
      cpu->rmsnorm_bwd(host(x, {n, d}), host(w, {d}), host(r, {n}), host(dy, {n, d}), host(dx2, {n, d}), Tensor());
      EXPECT_REL(download(bdx2), dx2, tol(t));
    }
  }
}

TEST_F(CudaOpsTest, MatmulAllTransposes) {
  const int64_t m = 37, n = 45, k = 71;
  for (DType t : kTypes) {
    for (DType ct : {DType::BF16, DType::F32}) {
      if (t == DType::F32 && ct == DType::BF16) continue;  // f32 inputs give f32 C only
      for (int ta = 0; ta < 2; ++ta) {
        for (int tb = 0; tb < 2; ++tb) {
          tag = std::string(ops::type_name(t)) + "->" + ops::type_name(ct) + " ta=" + std::to_string(ta) +
                " tb=" + std::to_string(tb);
          SCOPED_TRACE(tag);
          auto a = rand(m * k, t), b = rand(k * n, t), c = rand(m * n, ct);
          Buffer ba = upload(a, t), bb = upload(b, t), bc = upload(c, ct);
          Tensor va = ta ? ba.view({k, m}) : ba.view({m, k});
          Tensor vb = tb ? bb.view({n, k}) : bb.view({k, n});
          gpu->matmul(va, ta, vb, tb, bc.view({m, n}), 0.75, 0.5);
          Tensor ha = ta ? host(a, {k, m}) : host(a, {m, k});
          Tensor hb = tb ? host(b, {n, k}) : host(b, {k, n});
          cpu->matmul(ha, ta, hb, tb, host(c, {m, n}), 0.75, 0.5);
          EXPECT_REL(download(bc), c, tol(ct));  // bf16 -> f32: same inputs, fp32 sums
        }
      }
    }
  }
}

TEST_F(CudaOpsTest, RopeForwardAndInverse) {
  // hd 64 and 128: 8 pairs per thread through 16-byte accesses; hd 20: one pair per thread.
  for (DType t : kTypes) {
    for (int64_t hd : {64, 128, 20}) {
      tag = std::string(ops::type_name(t)) + " hd=" + std::to_string(hd);
      SCOPED_TRACE(tag);
      const int64_t n = 97, h = 5;
      auto x = rand(n * h * hd, t);
      std::vector<int32_t> pos(static_cast<size_t>(n));
      std::uniform_int_distribution<int32_t> pick(0, 1 << 20);  // long-context positions
      for (auto& p : pos) p = pick(rng);
      std::vector<float> inv(static_cast<size_t>(hd / 2));
      for (int64_t i = 0; i < hd / 2; ++i)
        inv[static_cast<size_t>(i)] = static_cast<float>(std::pow(500000.0, -2.0 * i / hd));
      Buffer bx = upload(x, t), bp = upload_i32(pos), bi = upload(inv, DType::F32);
      gpu->rope(bx.view({n, h, hd}), bp.flat(), bi.flat(), false);
      auto ref = x;
      cpu->rope(host(ref, {n, h, hd}), host_i32(pos, {n}), host(inv, {hd / 2}), false);
      EXPECT_REL(download(bx), ref, tol(t));
      gpu->rope(bx.view({n, h, hd}), bp.flat(), bi.flat(), true);  // inverse brings x back
      EXPECT_REL(download(bx), x, 2 * tol(t));
    }
  }
}

TEST_F(CudaOpsTest, SwiGlu) {
  // n = 12345: groups of 8 and a tail of 1; off 1: every pointer misaligned (scalar path).
  for (DType t : kTypes) {
    for (int64_t off : {0, 1}) {
      const int64_t n = off ? 4099 : 12345;
      tag = std::string(ops::type_name(t)) + " n=" + std::to_string(n) + " off=" + std::to_string(off);
      SCOPED_TRACE(tag);
      auto g = rand(n, t, -4, 4), u = rand(n, t), dh = rand(n, t);
      auto pad = [&](const std::vector<float>& v) { return upload_padded(v, t, off); };
      const std::vector<float> zeros(static_cast<size_t>(n));
      Padded bg = pad(g), bu = pad(u), bh = pad(zeros), bdh = pad(dh), bdg = pad(zeros), bdu = pad(zeros);
      poison(bh.buf);
      poison(bdg.buf);
      poison(bdu.buf);
      gpu->swiglu_fwd(bg.view({n}), bu.view({n}), bh.view({n}));
      gpu->swiglu_bwd(bg.view({n}), bu.view({n}), bdh.view({n}), bdg.view({n}), bdu.view({n}));
      std::vector<float> h(static_cast<size_t>(n)), dg(static_cast<size_t>(n)), du(static_cast<size_t>(n));
      cpu->swiglu_fwd(host(g, {n}), host(u, {n}), host(h, {n}));
      cpu->swiglu_bwd(host(g, {n}), host(u, {n}), host(dh, {n}), host(dg, {n}), host(du, {n}));
      EXPECT_REL(download(bh), h, tol(t));
      EXPECT_REL(download(bdg), dg, tol(t));
      EXPECT_REL(download(bdu), du, tol(t));
    }
  }
}

TEST_F(CudaOpsTest, LmHeadLossTiled) {
  for (DType t : kTypes) {
    SCOPED_TRACE(ops::type_name(t));
    tag = ops::type_name(t);
    const int64_t n = 53, d = 96, vocab = 1001, tile = 16;
    auto x = rand(n * d, t), w = rand(vocab * d, t), dw = rand(vocab * d, t);
    std::vector<int32_t> labels(static_cast<size_t>(n));
    std::uniform_int_distribution<int32_t> pick(-1, static_cast<int32_t>(vocab - 1));
    for (auto& l : labels) l = pick(rng);
    labels[3] = -1;
    Buffer bx = upload(x, t), bw = upload(w, t), bl = upload_i32(labels), bdx = gpu->alloc(t, n * d),
           bdw = upload(dw, t);
    poison(bdx);
    const double gs = 1.0 / 40;
    ops::LossSums g = gpu->lm_head_loss(bx.view({n, d}), bw.view({vocab, d}), bl.flat(), tile, gs, bdx.view({n, d}),
                                        bdw.view({vocab, d}));
    std::vector<float> dx(static_cast<size_t>(n * d));
    ops::LossSums c = cpu->lm_head_loss(host(x, {n, d}), host(w, {vocab, d}), host_i32(labels, {n}), tile, gs,
                                        host(dx, {n, d}), host(dw, {vocab, d}));
    EXPECT_EQ(g.count, c.count);
    EXPECT_NEAR(g.sum_nll, c.sum_nll, 1e-5 * std::abs(c.sum_nll));
    EXPECT_REL(download(bdx), dx, tol(t));
    EXPECT_REL(download(bdw), dw, tol(t));
    // Loss only (no backward) gives the same sums.
    ops::LossSums f = gpu->lm_head_loss(bx.view({n, d}), bw.view({vocab, d}), bl.flat(), 7, 0, Tensor(), Tensor());
    EXPECT_NEAR(f.sum_nll, g.sum_nll, 1e-6 * std::abs(g.sum_nll));
  }
}

// Backend::lm_head_score (the evaluations' LM head): each row's NLL against the CPU's, and the
// argmax flags wherever the CPU's top two logits are not within rounding of each other; a tie
// goes to the first index on both.
TEST_F(CudaOpsTest, LmHeadScoreMatchesCpu) {
  for (DType t : kTypes) {
    SCOPED_TRACE(ops::type_name(t));
    tag = ops::type_name(t);
    const int64_t n = 67, d = 96, vocab = 1001, tile = 16;
    auto x = rand(n * d, t), w = rand(vocab * d, t);
    for (int64_t c = 0; c < d; ++c) {  // row 0: logits 5 and 9 tied at the maximum
      w[static_cast<size_t>(5 * d + c)] = w[static_cast<size_t>(9 * d + c)] = c == 0 ? 4.0f : 0.0f;
      x[static_cast<size_t>(c)] = c == 0 ? 1.0f : 0.0f;
    }
    std::vector<std::vector<double>> logits(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(vocab)));
    std::vector<double> gap(static_cast<size_t>(n));
    std::vector<int32_t> labels(static_cast<size_t>(n));
    std::uniform_int_distribution<int32_t> pick(-1, static_cast<int32_t>(vocab - 1));
    for (int64_t i = 0; i < n; ++i) {
      auto& l = logits[static_cast<size_t>(i)];
      for (int64_t j = 0; j < vocab; ++j)
        for (int64_t c = 0; c < d; ++c)
          l[static_cast<size_t>(j)] += double(x[static_cast<size_t>(i * d + c)]) * w[static_cast<size_t>(j * d + c)];
      std::vector<double> s = l;
      std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<double>());
      gap[static_cast<size_t>(i)] = s[0] - s[1];
      const int32_t arg = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
      labels[static_cast<size_t>(i)] = i % 2 ? arg : pick(rng);
    }
    labels[0] = 5;
    labels[2] = -1;
    Buffer bx = upload(x, t), bw = upload(w, t), bl = upload_i32(labels);
    std::vector<double> gn(static_cast<size_t>(n), -1), cn(static_cast<size_t>(n), -1);
    std::vector<int32_t> gt(static_cast<size_t>(n), -1), ct(static_cast<size_t>(n), -1);
    gpu->lm_head_score(bx.view({n, d}), bw.view({vocab, d}), bl.flat(), tile, Tensor(gn.data(), DType::F64, {n}),
                       Tensor(gt.data(), DType::I32, {n}));
    cpu->lm_head_score(host(x, {n, d}), host(w, {vocab, d}), host_i32(labels, {n}), tile,
                       Tensor(cn.data(), DType::F64, {n}), Tensor(ct.data(), DType::I32, {n}));
    EXPECT_REL(gn, cn, 1e-5);
    int compared = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (labels[static_cast<size_t>(i)] < 0) {
        EXPECT_EQ(gn[static_cast<size_t>(i)], 0.0);
        EXPECT_EQ(gt[static_cast<size_t>(i)], 0);
        continue;
      }
      if (i == 0 || gap[static_cast<size_t>(i)] > 1e-3) {
        EXPECT_EQ(gt[static_cast<size_t>(i)], ct[static_cast<size_t>(i)]) << "row " << i;
        ++compared;
      }
    }
    EXPECT_EQ(gt[0], 1);  // the tie: index 5 before 9
    EXPECT_GT(compared, n / 2);
    // Its NLL sum is lm_head_loss's (same kernel arithmetic per row).
    const ops::LossSums ls =
        gpu->lm_head_loss(bx.view({n, d}), bw.view({vocab, d}), bl.flat(), tile, 0, Tensor(), Tensor());
    double sum = 0;
    for (double v : gn) sum += v;
    EXPECT_NEAR(ls.sum_nll, sum, 1e-9 * std::abs(sum));
  }
}

TEST_F(CudaOpsTest, AttentionMerge) {
  for (DType t : kTypes) {
    SCOPED_TRACE(ops::type_name(t));
    tag = ops::type_name(t);
    const int64_t b = 2, s = 33, h = 6, hd = 64;
    auto o = rand(b * s * h * hd, t), ob = rand(b * s * h * hd, t), l = rand(b * h * s, DType::F32, -3, 5),
         lb = rand(b * h * s, DType::F32, -3, 5);
    for (size_t i = 0; i < l.size(); i += 7) lb[i] = -INFINITY;  // blocks that saw no key
    for (size_t i = 3; i < l.size(); i += 11) l[i] = -INFINITY;  // a first block that saw none
    Buffer bo = upload(o, t), bob = upload(ob, t), bl = upload(l, DType::F32), blb = upload(lb, DType::F32);
    gpu->attention_merge(bo.view({b, s, h, hd}), bl.flat(), bob.view({b, s, h, hd}), blb.flat());
    cpu->attention_merge(host(o, {b, s, h, hd}), host(l, {b * h * s}), host(ob, {b, s, h, hd}), host(lb, {b * h * s}));
    EXPECT_REL(download(bo), o, tol(t));
    // Equal infinities (rows no block has seen) must match exactly; the rest by norm.
    auto gl = download(bl);
    std::vector<float> gf, rf;
    for (size_t i = 0; i < l.size(); ++i) {
      if (std::isinf(l[i])) {
        ASSERT_EQ(gl[i], l[i]) << "lse row " << i;
      } else {
        gf.push_back(gl[i]);
        rf.push_back(l[i]);
      }
    }
    EXPECT_REL(gf, rf, 1e-6);
  }
}

TEST_F(CudaOpsTest, AdamW) {
  const int64_t n = 54321;
  tag = "f32";
  auto p = random_vector<float>(n, rng), g = random_vector<float>(n, rng), m = random_vector<float>(n, rng, -0.1, 0.1),
       v = random_vector<float>(n, rng, 0, 0.01);
  Buffer bp = upload(p, DType::F32), bg = upload(g, DType::F32), bm = upload(m, DType::F32), bv = upload(v, DType::F32);
  ops::AdamWStep s;
  s.lr = 3e-4;
  s.weight_decay = 0.1;
  s.step = 7;
  gpu->adamw(bp.flat(), bg.flat(), bm.flat(), bv.flat(), s);
  cpu->adamw(host(p, {n}), host(g, {n}), host(m, {n}), host(v, {n}), s);
  EXPECT_REL(download(bp), p, 1e-6);
  EXPECT_REL(download(bm), m, 1e-6);
  EXPECT_REL(download(bv), v, 1e-6);
}

}  // namespace
}  // namespace easyctx::test
