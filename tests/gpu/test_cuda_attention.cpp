// CUDA attention (bf16, fp32 LSE) against the CPU reference in fp32 on the same bf16-rounded
// inputs: forward o/lse and backward dq/dk/dv (accumulated onto random starting values),
// with causal offsets (including rows that see no key: o = 0, lse = -inf), non-causal
// blocks, GQA 32/4 and head dims 64 and 128, causal squares (forward through cuDNN's causal
// graph or in query chunks, backward in tiles through cuDNN's composite graph when cuDNN is
// allowed; on an sm_90 device also the forward and the backward the router gives the Hopper
// kernels), and the backward into f32 gradients (a ring's accumulators). Outputs are
// NaN-poisoned before the forward.
#include <sstream>

#include "cuda_test_util.h"
#include "kernels/attention_sm90.h"
#include "ops/attention_route.h"

namespace easyctx::test {
namespace {

struct Case {
  int64_t b, sq, sk, hq, hkv, hd;
  bool causal;
  int64_t q_off, k_off;
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << "B" << c.b << " Sq" << c.sq << " Sk" << c.sk << " Hq" << c.hq << " Hkv" << c.hkv << " hd" << c.hd
            << (c.causal ? " causal" : " full") << " q_off" << c.q_off << " k_off" << c.k_off;
}

class CudaAttentionTest : public CudaOpsTest, public ::testing::WithParamInterface<Case> {
 protected:
  void run_case(const Case& c);
  bool use_cudnn_ = false;
  bool causal_graph_ = true;
  bool hopper_ = false;  // CudaBackendOptions::sm90_attention (the Hopper forward and backward where routed)
};

bool causal_square(const Case& c) { return c.causal && c.sq == c.sk && c.q_off == c.k_off; }

// Blocks run through cuDNN where it has a plan (cudnn_attention = true, the default: causal
// squares' forward through the composite causal graph, blocks without a mask through the
// SDPA node, every backward through the composite graph) and through our kernels otherwise:
// every case runs both ways; long causal squares also with the graph off (query chunks); on an
// sm_90 device once more with the Hopper kernels in the router (the default): the forward and
// the backward where the router puts them first, checked by the path they report.
TEST_P(CudaAttentionTest, ForwardBackwardMatchReference) {
  struct Mode {
    bool cudnn, graph, hopper;
    const char* what;
  };
  for (const Mode m : {Mode{false, false, false, "kernels only"}, Mode{true, true, false, "cudnn allowed"},
                       Mode{true, false, false, "cudnn, causal squares in query chunks"},
                       Mode{true, true, true, "the default router on sm_90 (Hopper kernels)"}}) {
    if (m.cudnn && !m.graph && !(causal_square(GetParam()) && GetParam().sq >= 2048)) continue;
    if (m.hopper && !kernels::sm90_device_available()) {
      std::printf("[path] %s: not an sm_90 device, no Hopper kernel to check\n", m.what);
      continue;
    }
    ops::CudaBackendOptions opts;
    opts.cudnn_attention = m.cudnn;
    opts.cudnn_causal_graph = m.graph;
    opts.sm90_attention = m.hopper;
    opts.attention_bwd_tile = 1024;  // the long squares below reach the tiled backward
    gpu = ops::make_cuda_backend(opts);
    use_cudnn_ = m.cudnn;
    causal_graph_ = m.graph;
    hopper_ = m.hopper;
    SCOPED_TRACE(m.what);
    run_case(GetParam());
    std::printf("[path] %s: %s\n", tag.c_str(), ops::cuda_attention_path(*gpu).c_str());
  }
}

void CudaAttentionTest::run_case(const Case& c) {
  tag = (std::ostringstream() << c).str() + (hopper_      ? " [hopper]"
                                             : use_cudnn_ ? (causal_graph_ ? " [cudnn ok]" : " [cudnn, chunks]")
                                                          : " [kernels]");
  const DType t = DType::BF16;
  const int64_t nq = c.b * c.sq * c.hq * c.hd, nk = c.b * c.sk * c.hkv * c.hd, nl = c.b * c.hq * c.sq;
  ops::AttentionBlock blk;
  blk.scale = 1.0 / std::sqrt(static_cast<double>(c.hd));
  blk.causal = c.causal;
  blk.q_offset = c.q_off;
  blk.k_offset = c.k_off;
  auto q = rand(nq, t, -2, 2), k = rand(nk, t, -2, 2), v = rand(nk, t);

  // Forward.
  Buffer bq = upload(q, t), bk = upload(k, t), bv = upload(v, t), bo = gpu->alloc(t, nq),
         bl = gpu->alloc(DType::F32, nl);
  poison(bo);
  poison(bl);
  auto qv = [&](const Buffer& x) { return x.view({c.b, c.sq, c.hq, c.hd}); };
  auto kv = [&](const Buffer& x) { return x.view({c.b, c.sk, c.hkv, c.hd}); };
  gpu->attention_fwd(qv(bq), kv(bk), kv(bv), blk, qv(bo), bl.flat());
  const std::string fwd_path = ops::cuda_attention_path(*gpu);
  std::printf("[path] forward %s: %s\n", tag.c_str(), fwd_path.c_str());
  // The routes the backend's router names for this call (Backend::attention_route).
  const ops::AttentionCall call{c.b, c.sq, c.sk, c.hq, c.hkv, c.hd, c.causal, c.q_off - c.k_off};
  if (gpu->attention_route(call, false) == "sm90 kernel") {
    EXPECT_EQ(fwd_path, "sm90 kernel");
  } else if (use_cudnn_ && causal_square(c) && causal_graph_) {
    EXPECT_NE(fwd_path.find("causal graph"), std::string::npos)
        << "a causal square's forward should run cuDNN's causal graph";
  }
  if (use_cudnn_ && causal_square(c) && !causal_graph_ && c.b == 1 && c.sq >= 2048) {
    EXPECT_NE(fwd_path.find("chunks"), std::string::npos)
        << "with the graph off, a long causal square runs in query chunks";
  }
  std::vector<float> o(static_cast<size_t>(nq)), l(static_cast<size_t>(nl));
  cpu->attention_fwd(host(q, {c.b, c.sq, c.hq, c.hd}), host(k, {c.b, c.sk, c.hkv, c.hd}),
                     host(v, {c.b, c.sk, c.hkv, c.hd}), blk, host(o, {c.b, c.sq, c.hq, c.hd}), host(l, {nl}));
  const auto go = download(bo), gl = download(bl);
  EXPECT_REL(go, o, 1e-2);
  const int64_t empty = expect_lse_close(gl, l, tag);
  if (empty) RecordProperty("empty_rows", static_cast<int>(empty));
  // Backward from the reference's o (rounded) and lse, onto random dq/dk/dv.
  // Small starting values: the bf16 rounding of start + increment stays small next to the
  // increment, so the increment check below stays meaningful.
  auto orr = rounded(o, t), dout = rand(nq, t), dq = rand(nq, t, -0.05, 0.05), dk = rand(nk, t, -0.05, 0.05),
       dv = rand(nk, t, -0.05, 0.05);
  Buffer bo2 = upload(orr, t), bl2 = upload(l, DType::F32), bdo = upload(dout, t), bdq = upload(dq, t),
         bdk = upload(dk, t), bdv = upload(dv, t);
  gpu->attention_bwd(qv(bq), kv(bk), kv(bv), qv(bo2), bl2.flat(), qv(bdo), blk, qv(bdq), kv(bdk), kv(bdv));
  const std::string bwd_path = ops::cuda_attention_path(*gpu);
  std::printf("[path] backward %s: %s\n", tag.c_str(), bwd_path.c_str());
  if (gpu->attention_route(call, true) == "sm90 kernel") {
    EXPECT_EQ(bwd_path, "sm90 kernel (deterministic-split)");
  } else if (use_cudnn_ && c.causal && c.b == 1 && c.sq == c.sk && c.q_off == c.k_off && c.sq >= 2048) {
    EXPECT_NE(bwd_path.find("tiles"), std::string::npos) << "a long causal square's backward should run in tiles";
  }
  if (use_cudnn_) { EXPECT_EQ(bwd_path.find("atomic"), std::string::npos) << "deterministic by default: " << bwd_path; }
  // The reference accumulates onto the same start; compare the increments' effect overall
  // and the increments alone (stricter when the increment is small next to the start).
  auto dq0 = dq, dk0 = dk, dv0 = dv;
  cpu->attention_bwd(host(q, {c.b, c.sq, c.hq, c.hd}), host(k, {c.b, c.sk, c.hkv, c.hd}),
                     host(v, {c.b, c.sk, c.hkv, c.hd}), host(orr, {c.b, c.sq, c.hq, c.hd}), host(l, {nl}),
                     host(dout, {c.b, c.sq, c.hq, c.hd}), blk, host(dq, {c.b, c.sq, c.hq, c.hd}),
                     host(dk, {c.b, c.sk, c.hkv, c.hd}), host(dv, {c.b, c.sk, c.hkv, c.hd}));
  const auto gdq = download(bdq), gdk = download(bdk), gdv = download(bdv);
  EXPECT_ACCUMULATED(gdq, dq, dq0);
  EXPECT_ACCUMULATED(gdk, dk, dk0);
  EXPECT_ACCUMULATED(gdv, dv, dv0);

  // Deterministic: the same backward again from the same start is bit-identical.
  Buffer cdq = upload(dq0, t), cdk = upload(dk0, t), cdv = upload(dv0, t);
  gpu->attention_bwd(qv(bq), kv(bk), kv(bv), qv(bo2), bl2.flat(), qv(bdo), blk, qv(cdq), kv(cdk), kv(cdv));
  EXPECT_EQ(download_bits(cdq), download_bits(bdq));
  EXPECT_EQ(download_bits(cdk), download_bits(bdk));
  EXPECT_EQ(download_bits(cdv), download_bits(bdv));

  // f32 gradients (a ring's accumulators): the same increments, added in fp32.
  {
    Buffer fdq = upload(dq0, DType::F32), fdk = upload(dk0, DType::F32), fdv = upload(dv0, DType::F32);
    gpu->attention_bwd(qv(bq), kv(bk), kv(bv), qv(bo2), bl2.flat(), qv(bdo), blk, qv(fdq), kv(fdk), kv(fdv));
    std::printf("[path] f32-gradient backward %s: %s\n", tag.c_str(), ops::cuda_attention_path(*gpu).c_str());
    EXPECT_REL(increment(download(fdq), dq0), increment(dq, dq0), 3e-2);
    EXPECT_REL(increment(download(fdk), dk0), increment(dk, dk0), 3e-2);
    EXPECT_REL(increment(download(fdv), dv0), increment(dv, dv0), 3e-2);
  }

  // Overwriting (blk.accumulate false, LocalAttention's call): NaN-poisoned gradients come
  // back as the increments alone (causal squares and full blocks: cuDNN writes them in
  // place in one call), deterministic and atomic.
  for (bool det : {true, false}) {
    if (!det && !use_cudnn_) continue;
    ops::CudaBackendOptions o2;
    o2.cudnn_attention = use_cudnn_;
    o2.cudnn_causal_graph = causal_graph_;
    o2.deterministic = det;
    o2.sm90_attention = hopper_;
    o2.attention_bwd_tile = 1024;
    auto be2 = ops::make_cuda_backend(o2);
    ops::AttentionBlock ob = blk;
    ob.accumulate = false;
    Buffer odq = gpu->alloc(t, nq), odk = gpu->alloc(t, nk), odv = gpu->alloc(t, nk);
    poison(odq);
    poison(odk);
    poison(odv);
    gpu->synchronize();  // be2 runs on its own stream
    be2->attention_bwd(qv(bq), kv(bk), kv(bv), qv(bo2), bl2.flat(), qv(bdo), ob, qv(odq), kv(odk), kv(odv));
    be2->synchronize();
    const std::string opath = ops::cuda_attention_path(*be2);
    std::printf("[path] overwriting backward %s%s: %s\n", tag.c_str(), det ? "" : " atomic", opath.c_str());
    ops::AttentionCall ocall = call;
    ocall.accumulate = false;
    const std::string oroute = be2->attention_route(ocall, true);
    if (oroute == "sm90 kernel") {
      EXPECT_EQ(opath.rfind("sm90 kernel", 0), 0u) << opath;
    } else if (use_cudnn_ && (causal_square(c) || !c.causal) && (!det || (c.sq <= 1024 && c.sk <= 1024))) {
      EXPECT_EQ(oroute, "cudnn one call in place");
      EXPECT_NE(opath.find("in place"), std::string::npos) << "one block, overwriting: cuDNN in place";
    }
    EXPECT_REL(download(odq), increment(dq, dq0), 3e-2);
    EXPECT_REL(download(odk), increment(dk, dk0), 3e-2);
    EXPECT_REL(download(odv), increment(dv, dv0), 3e-2);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaAttentionTest,
    ::testing::Values(Case{1, 200, 200, 4, 4, 64, true, 0, 0},     // plain causal, ragged tiles
                      Case{2, 150, 130, 8, 2, 128, true, 64, 0},   // queries later than keys
                      Case{1, 128, 128, 4, 1, 64, true, 0, 100},   // rows 0..99 see no key
                      Case{1, 97, 300, 6, 3, 128, true, 250, 10},  // Sq != Sk, diagonal inside
                      Case{1, 77, 190, 8, 4, 64, false, 0, 0},     // full (off-diagonal ring block)
                      Case{1, 256, 256, 32, 4, 128, true, 0, 0},   // GQA 32/4, hd 128
                      Case{1, 256, 256, 32, 4, 64, true, 0, 0},    // GQA 32/4, hd 64
                      Case{1, 64, 64, 2, 2, 128, true, 0, 1000},   // no row sees any key
                      Case{1, 256, 384, 32, 4, 128, false, 0, 0},  // full, GQA 32/4, hd 128
                      Case{2, 128, 200, 8, 2, 64, true, 300, 0},   // causal, every key visible
                      Case{2, 300, 300, 8, 2, 128, true, 0, 0},    // causal squares, batch 2
                      // Long causal squares: with cuDNN the forward runs the causal graph (or, with
                      // it off, query chunks of 1024 rows: prefix through cuDNN, diagonal through
                      // the kernel, LSE merge), the backward 1024 x 1024 tiles (causal diagonal
                      // tiles); the last is short.
                      Case{1, 2304, 2304, 4, 2, 64, true, 0, 0}, Case{1, 3072, 3072, 8, 8, 128, true, 0, 0},
                      // A long block without a mask (a ring's off-diagonal step): 2 x 3 backward
                      // tiles, the last ones short.
                      Case{1, 1500, 2200, 8, 2, 64, false, 0, 0}),
    [](const ::testing::TestParamInfo<Case>& i) { return "case" + std::to_string(i.index); });

}  // namespace
}  // namespace easyctx::test
