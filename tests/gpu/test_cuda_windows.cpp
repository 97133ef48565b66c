// Sliding-window attention (ops::AttentionBlock::window) on the CUDA backend against the CPU
// reference (fp32, the same bf16-rounded inputs): LocalAttention over whole sequences (one GPU's
// causal square) at several lengths with windows smaller and larger than the kernels' key tiles
// (64 keys FA2, 128 Hopper), of 1 (a query sees itself only) and past the sequence (no window in
// effect), GQA 32/8 and 28/4 at head dim 128 and 8/2 at 64, batch 2, packed documents too; and
// masked_attention_fwd/bwd on single blocks the window cuts (a ring's off-diagonal block, a
// causal block with a diagonal offset, documents), accumulating onto bf16 and f32 gradients.
// Forward o/lse and backward dq/dk/dv, outputs NaN-poisoned first; deterministic modes rerun
// bit-identically. Every case runs in each backend mode that picks routes: the trainer's
// default (atomic, the Hopper kernels on sm_90), train.deterministic, the FA2 kernels alone;
// each prints the routes its calls took (a windowed call: "sm90 kernel" or "kernel").
#include <set>
#include <sstream>

#include "attention/documents.h"
#include "cuda_test_util.h"
#include "kernels/attention_sm90.h"
#include "ops/attention_route.h"

namespace easyctx::test {
namespace {

using attention::DocumentStarts;

DocumentStarts starts_of(const std::vector<int64_t>& lengths) {
  DocumentStarts s;
  int64_t at = 0;
  for (int64_t n : lengths) {
    s.push_back(at);
    at += n;
  }
  return s;
}

struct Mode {
  bool cudnn, hopper, deterministic;
  const char* what;
};
const Mode kModes[] = {
    {true, true, false, "train default (atomic, Hopper on sm_90)"},
    {true, true, true, "train.deterministic (Hopper on sm_90)"},
    {true, false, true, "cudnn + FA2 kernels, deterministic"},
    {false, false, false, "FA2 kernels only, atomic options"},
};

class CudaWindowsTest : public CudaOpsTest {
 protected:
  // False (with a line saying why) for a Hopper mode on a device that is not sm_90.
  bool use_mode(const Mode& m) {
    if (m.hopper && !kernels::sm90_device_available()) {
      std::printf("[path] %s: not an sm_90 device, the mode runs no Hopper kernel; skipped\n", m.what);
      return false;
    }
    ops::CudaBackendOptions o;
    o.cudnn_attention = m.cudnn;
    o.sm90_attention = m.hopper;
    o.deterministic = m.deterministic;
    gpu = ops::make_cuda_backend(o);
    return true;
  }
  void note_route(const ops::AttentionCall& c) {
    fwd_.insert(gpu->attention_route(c, false));
    bwd_.insert(gpu->attention_route(c, true));
  }
  void print_routes() {
    auto join = [](const std::set<std::string>& s) {
      std::string r;
      for (const auto& x : s) r += (r.empty() ? "" : ", ") + x;
      return r;
    };
    std::printf("[routes] %s: forward {%s}; backward {%s}; last call %s\n", tag.c_str(), join(fwd_).c_str(),
                join(bwd_).c_str(), ops::cuda_attention_path(*gpu).c_str());
    fwd_.clear();
    bwd_.clear();
  }
  std::set<std::string> fwd_, bwd_;
};

// ---- LocalAttention: one GPU's whole sequences.

struct LocalCase {
  int64_t B, S, hq, hkv, hd, window;
  std::vector<int64_t> docs;  // document lengths (every sequence alike); empty: one document
};
std::ostream& operator<<(std::ostream& os, const LocalCase& c) {
  return os << "B" << c.B << " S" << c.S << " Hq" << c.hq << " Hkv" << c.hkv << " hd" << c.hd << " window " << c.window
            << (c.docs.empty() ? "" : " docs " + std::to_string(c.docs.size()));
}

class CudaLocalWindows : public CudaWindowsTest, public ::testing::WithParamInterface<LocalCase> {
 protected:
  void run_mode(const LocalCase& c, const Mode& m);
  std::vector<DocumentStarts> docs_;
  std::vector<float> q_, k_, v_, dout_, o_, lse_, dq_, dk_, dv_;  // inputs, then the CPU reference
};

TEST_P(CudaLocalWindows, MatchesReference) {
  const LocalCase& c = GetParam();
  int64_t total = 0;
  for (int64_t n : c.docs) total += n;
  ASSERT_TRUE(c.docs.empty() || total == c.S);
  docs_.assign(static_cast<size_t>(c.B), c.docs.empty() ? DocumentStarts{0} : starts_of(c.docs));
  const DType t = DType::BF16;
  const int64_t nq = c.B * c.S * c.hq * c.hd, nk = c.B * c.S * c.hkv * c.hd;
  q_ = rand(nq, t, -2, 2);
  k_ = rand(nk, t, -2, 2);
  v_ = rand(nk, t);
  dout_ = rand(nq, t);
  o_.assign(static_cast<size_t>(nq), 0);
  lse_.assign(static_cast<size_t>(c.B * c.hq * c.S), 0);
  dq_.assign(static_cast<size_t>(nq), -3);
  dk_.assign(static_cast<size_t>(nk), -3);
  dv_.assign(static_cast<size_t>(nk), -3);
  attention::LocalAttention a(*cpu);
  auto hq = [&](std::vector<float>& x) { return host(x, {c.B, c.S, c.hq, c.hd}); };
  auto hk = [&](std::vector<float>& x) { return host(x, {c.B, c.S, c.hkv, c.hd}); };
  const double scale = 1 / std::sqrt(static_cast<double>(c.hd));
  const attention::AttentionTensors ht{hq(q_), hk(k_),       hk(v_),  hq(o_), host(lse_, {c.B, c.hq, c.S}),
                                       scale,  docs_.data(), c.window};
  a.forward(ht);
  o_ = rounded(o_, t);  // the backward's o: what the GPU holds
  a.backward(ht, {hq(dout_), hq(dq_), hk(dk_), hk(dv_)});
  for (const Mode& m : kModes) {
    if (!use_mode(m)) continue;
    SCOPED_TRACE(m.what);
    run_mode(c, m);
  }
}

void CudaLocalWindows::run_mode(const LocalCase& c, const Mode& m) {
  tag = (std::ostringstream() << c << " [" << m.what << "]").str();
  const DType t = DType::BF16;
  Buffer bq = upload(q_, t), bk = upload(k_, t), bv = upload(v_, t),
         bo = gpu->alloc(t, static_cast<int64_t>(o_.size())),
         bl = gpu->alloc(DType::F32, static_cast<int64_t>(lse_.size()));
  poison(bo);
  poison(bl);
  auto qv = [&](const Buffer& x) { return x.view({c.B, c.S, c.hq, c.hd}); };
  auto kv = [&](const Buffer& x) { return x.view({c.B, c.S, c.hkv, c.hd}); };
  attention::LocalAttention a(*gpu);
  const double scale = 1 / std::sqrt(static_cast<double>(c.hd));
  a.forward({qv(bq), kv(bk), kv(bv), qv(bo), bl.view({c.B, c.hq, c.S}), scale, docs_.data(), c.window});
  EXPECT_REL(download(bo), o_, 1e-2);
  expect_lse_close(download(bl), lse_, tag);
  // The backward from the reference's o and lse, into poisoned gradients.
  Buffer bo2 = upload(o_, t), bl2 = upload(lse_, DType::F32), bdo = upload(dout_, t);
  const attention::AttentionTensors gt{qv(bq), kv(bk),       kv(bv),  qv(bo2), bl2.view({c.B, c.hq, c.S}),
                                       scale,  docs_.data(), c.window};
  auto backward = [&](Buffer& dq, Buffer& dk, Buffer& dv) {
    dq = gpu->alloc(t, static_cast<int64_t>(dq_.size()));
    dk = gpu->alloc(t, static_cast<int64_t>(dk_.size()));
    dv = gpu->alloc(t, static_cast<int64_t>(dv_.size()));
    poison(dq);
    poison(dk);
    poison(dv);
    a.backward(gt, {qv(bdo), qv(dq), kv(dk), kv(dv)});
  };
  Buffer dq, dk, dv;
  backward(dq, dk, dv);
  EXPECT_REL(download(dq), dq_, 3e-2);
  EXPECT_REL(download(dk), dk_, 3e-2);
  EXPECT_REL(download(dv), dv_, 3e-2);
  if (m.deterministic) {  // bit-identical on a rerun
    Buffer dq2, dk2, dv2;
    backward(dq2, dk2, dv2);
    EXPECT_EQ(download_bits(dq2), download_bits(dq));
    EXPECT_EQ(download_bits(dk2), download_bits(dk));
    EXPECT_EQ(download_bits(dv2), download_bits(dv));
  }
  ops::AttentionBlock blk;
  blk.scale = scale;
  blk.window = c.window;
  blk.accumulate = false;
  for (const attention::DocumentPart& p : attention::visible_parts(&docs_[0], blk, c.S, c.S)) {
    ops::AttentionCall call{c.B, p.q_len, p.k_len, c.hq, c.hkv, c.hd, p.causal, p.q_row - p.k_row};
    call.window = ops::effective_window(c.window, p.q_len, p.k_len, p.q_row - p.k_row);
    call.accumulate = false;
    note_route(call);
  }
  print_routes();
}

INSTANTIATE_TEST_SUITE_P(Windows, CudaLocalWindows,
                         ::testing::Values(
                             // Mistral's GQA 32/8 x 128: windows inside one key tile and over several.
                             LocalCase{1, 1000, 32, 8, 128, 37, {}}, LocalCase{1, 1000, 32, 8, 128, 300, {}},
                             // Qwen2.5's GQA 28/4 x 128, batch 2, an odd length.
                             LocalCase{2, 777, 28, 4, 128, 200, {}},
                             // Head dim 64; a window of 1 (each query sees itself only); many query tiles (4100 rows:
                             // more work tiles than SMs, ragged last tiles).
                             LocalCase{1, 1500, 8, 2, 64, 1, {}}, LocalCase{1, 4100, 8, 2, 128, 1500, {}},
                             LocalCase{1, 4100, 16, 2, 64, 700, {}},
                             // Windows of whole key tiles (128: the Hopper kernels' tile, two of FA2's; 256 at hd 64,
                             // whose Hopper query tiles are 192 rows): the left edge on a tile boundary.
                             LocalCase{1, 1000, 8, 2, 128, 128, {}}, LocalCase{1, 1100, 8, 2, 64, 256, {}},
                             // Packed documents and a window (documents longer and shorter than it).
                             LocalCase{1, 1200, 8, 2, 64, 129, {1, 2, 17, 333, 500, 347}},
                             LocalCase{2, 900, 28, 4, 128, 64, {700, 1, 3, 64, 132}},
                             // A window past the sequence: no window in effect (the routes without one).
                             LocalCase{1, 500, 32, 8, 128, 4096, {}}),
                         [](const ::testing::TestParamInfo<LocalCase>& i) { return "case" + std::to_string(i.index); });

// ---- One block (a ring's step or a strategy's sub-block) of one sequence.

struct BlockCase {
  int64_t sq, sk, hq, hkv, hd;
  bool causal;
  int64_t q_off, k_off, window;
  std::vector<int64_t> docs;  // the whole sequence's documents (empty: one)
};
std::ostream& operator<<(std::ostream& os, const BlockCase& c) {
  return os << "Sq" << c.sq << "@" << c.q_off << " Sk" << c.sk << "@" << c.k_off << " Hq" << c.hq << " Hkv" << c.hkv
            << " hd" << c.hd << (c.causal ? " causal" : " full") << " window " << c.window
            << (c.docs.empty() ? "" : " docs " + std::to_string(c.docs.size()));
}

class CudaBlockWindows : public CudaWindowsTest, public ::testing::WithParamInterface<BlockCase> {
 protected:
  void run_mode(const BlockCase& c, const Mode& m);
  void backward(const BlockCase& c, const ops::AttentionBlock& blk, DType gt);
  std::vector<float> q_, k_, v_, o_, lse_;
  DocumentStarts docs_;
  Buffer bq_, bk_, bv_;
};

void CudaBlockWindows::run_mode(const BlockCase& c, const Mode& m) {
  tag = (std::ostringstream() << c << " [" << m.what << "]").str();
  const DType t = DType::BF16;
  docs_ = c.docs.empty() ? DocumentStarts{0} : starts_of(c.docs);
  const int64_t nq = c.sq * c.hq * c.hd, nk = c.sk * c.hkv * c.hd;
  q_ = rand(nq, t, -2, 2);
  k_ = rand(nk, t, -2, 2);
  v_ = rand(nk, t);
  ops::AttentionBlock blk;
  blk.scale = 1 / std::sqrt(static_cast<double>(c.hd));
  blk.causal = c.causal;
  blk.q_offset = c.q_off;
  blk.k_offset = c.k_off;
  blk.window = c.window;
  o_.assign(static_cast<size_t>(nq), 0);
  lse_.assign(static_cast<size_t>(c.hq * c.sq), 0);
  const bool seen = attention::masked_attention_fwd(*cpu, &docs_, host(q_, {1, c.sq, c.hq, c.hd}),
                                                    host(k_, {1, c.sk, c.hkv, c.hd}), host(v_, {1, c.sk, c.hkv, c.hd}),
                                                    blk, host(o_, {1, c.sq, c.hq, c.hd}), host(lse_, {1, c.hq, c.sq}));
  bq_ = upload(q_, t);
  bk_ = upload(k_, t);
  bv_ = upload(v_, t);
  Buffer bo = gpu->alloc(t, nq), bl = gpu->alloc(DType::F32, c.hq * c.sq);
  poison(bo);
  poison(bl);
  const bool gseen = attention::masked_attention_fwd(*gpu, &docs_, bq_.view({1, c.sq, c.hq, c.hd}),
                                                     bk_.view({1, c.sk, c.hkv, c.hd}), bv_.view({1, c.sk, c.hkv, c.hd}),
                                                     blk, bo.view({1, c.sq, c.hq, c.hd}), bl.view({1, c.hq, c.sq}));
  EXPECT_EQ(gseen, seen);
  EXPECT_REL(download(bo), o_, 1e-2);
  expect_lse_close(download(bl), lse_, tag);
  o_ = rounded(o_, t);
  for (DType gt : {DType::BF16, DType::F32}) backward(c, blk, gt);
  for (const attention::DocumentPart& p : attention::visible_parts(&docs_, blk, c.sq, c.sk)) {
    const int64_t diag = (c.q_off + p.q_row) - (c.k_off + p.k_row);
    ops::AttentionCall call{1, p.q_len, p.k_len, c.hq, c.hkv, c.hd, p.causal, diag};
    call.window = ops::effective_window(c.window, p.q_len, p.k_len, diag);
    note_route(call);
  }
  print_routes();
}

// Accumulates onto random starting gradients of type gt (bf16, or f32: a ring's accumulators).
void CudaBlockWindows::backward(const BlockCase& c, const ops::AttentionBlock& blk, DType gt) {
  const DType t = DType::BF16;
  const int64_t nq = c.sq * c.hq * c.hd, nk = c.sk * c.hkv * c.hd;
  auto dout = rand(nq, t), dq0 = rand(nq, gt, -0.05, 0.05), dk0 = rand(nk, gt, -0.05, 0.05),
       dv0 = rand(nk, gt, -0.05, 0.05);
  auto dq = dq0, dk = dk0, dv = dv0;
  attention::masked_attention_bwd(
      *cpu, &docs_, host(q_, {1, c.sq, c.hq, c.hd}), host(k_, {1, c.sk, c.hkv, c.hd}), host(v_, {1, c.sk, c.hkv, c.hd}),
      host(o_, {1, c.sq, c.hq, c.hd}), host(lse_, {1, c.hq, c.sq}), host(dout, {1, c.sq, c.hq, c.hd}), blk,
      host(dq, {1, c.sq, c.hq, c.hd}), host(dk, {1, c.sk, c.hkv, c.hd}), host(dv, {1, c.sk, c.hkv, c.hd}));
  Buffer bo = upload(o_, t), bl = upload(lse_, DType::F32), bdo = upload(dout, t), bdq = upload(dq0, gt),
         bdk = upload(dk0, gt), bdv = upload(dv0, gt);
  auto qv = [&](const Buffer& x) { return x.view({1, c.sq, c.hq, c.hd}); };
  auto kv = [&](const Buffer& x) { return x.view({1, c.sk, c.hkv, c.hd}); };
  attention::masked_attention_bwd(*gpu, &docs_, qv(bq_), kv(bk_), kv(bv_), qv(bo), bl.view({1, c.hq, c.sq}), qv(bdo),
                                  blk, qv(bdq), kv(bdk), kv(bdv));
  const std::string base = tag;
  tag = base + (gt == DType::F32 ? " f32 grads" : " bf16 grads");
  const auto gdq = download(bdq), gdk = download(bdk), gdv = download(bdv);
  EXPECT_ACCUMULATED(gdq, dq, dq0);
  EXPECT_ACCUMULATED(gdk, dk, dk0);
  EXPECT_ACCUMULATED(gdv, dv, dv0);
  tag = base;
}

TEST_P(CudaBlockWindows, MatchesReference) {
  for (const Mode& m : kModes) {
    if (!use_mode(m)) continue;
    SCOPED_TRACE(m.what);
    run_mode(GetParam(), m);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Blocks, CudaBlockWindows,
    ::testing::Values(
        // A ring's off-diagonal step: queries [1500, 2200) after keys [200, 1100), causal false,
        // window 1000: the first queries see most keys, the last ones the block's last 100 or none.
        BlockCase{700, 900, 32, 8, 128, false, 1500, 200, 1000, {}},
        // A causal block with queries [600, 1237) over keys [0, 900) and a window of 350.
        BlockCase{637, 900, 28, 4, 128, true, 600, 0, 350, {}},
        // A thin corner: a 512 x 512 block just before its queries, window 100 (a triangle of it).
        BlockCase{512, 512, 8, 2, 64, false, 512, 0, 100, {}},
        // Documents and a window together, causal false.
        BlockCase{837, 1000, 8, 2, 64, false, 400, 0, 250, {3, 297, 400, 1, 1, 335}}),
    [](const ::testing::TestParamInfo<BlockCase>& i) { return "case" + std::to_string(i.index); });

}  // namespace
}  // namespace easyctx::test
