// Document masking (attention/documents.h) on the CUDA backend against the CPU reference
// (fp32, the same bf16-rounded inputs): LocalAttention over packed sequences at odd lengths
// (documents of 1, 2, 17, 333, ... tokens, a different packing per sequence of the batch, GQA
// 8/2, head dims 64 and 128): forward o/lse, backward dq/dk/dv (overwritten, NaN-poisoned
// first); and masked_attention_fwd/bwd on one block that is not a causal square (queries
// after the keys, causal false: rectangles of unequal q/k lengths; a causal block with a
// diagonal offset), accumulating onto bf16 and f32 gradients, rows without keys (o = 0,
// lse = -inf) included. Every case runs in each backend mode that picks routes: the trainer's
// default (atomic) and train.deterministic (the Hopper kernels where the router puts them on
// sm_90), cuDNN with the FA2 kernels (no Hopper), cuDNN's causal squares in query chunks, and
// the FA2 kernels alone; each prints the routes its parts took (the router's names).
#include <set>
#include <sstream>

#include "attention/documents.h"
#include "cuda_test_util.h"
#include "kernels/attention_sm90.h"
#include "ops/attention_route.h"

namespace easyctx::test {
namespace {

using attention::DocumentPart;
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
int64_t total(const std::vector<int64_t>& lengths) {
  int64_t n = 0;
  for (int64_t x : lengths) n += x;
  return n;
}
int64_t longest(const std::vector<std::vector<int64_t>>& lengths) {
  int64_t n = 0;
  for (const auto& l : lengths)
    for (int64_t x : l) n = std::max(n, x);
  return n;
}

// The backend modes (CudaBackendOptions) every case runs in.
struct Mode {
  bool cudnn, graph, hopper, deterministic;
  int64_t tile;  // attention_bwd_tile (0: the backend's default, as the trainer has it)
  const char* what;
};
const Mode kModes[] = {
    {true, true, true, false, 0, "train default (atomic, Hopper on sm_90)"},
    {true, true, true, true, 0, "train.deterministic (Hopper on sm_90)"},
    {true, true, false, true, 1024, "cudnn + FA2 kernels, deterministic"},
    {true, true, false, false, 1024, "cudnn + FA2 kernels, atomic"},
    {true, false, false, true, 1024, "cudnn, causal squares in query chunks"},
    {false, false, false, true, 0, "FA2 kernels only"},
};

std::unique_ptr<ops::Backend> backend_for(const Mode& m) {
  ops::CudaBackendOptions o;
  o.cudnn_attention = m.cudnn;
  o.cudnn_causal_graph = m.graph;
  o.sm90_attention = m.hopper;
  o.deterministic = m.deterministic;
  o.attention_bwd_tile = m.tile;
  return ops::make_cuda_backend(o);
}

class CudaDocumentsTest : public CudaOpsTest {
 protected:
  // False (with a line saying why) for a Hopper mode on a device that is not sm_90.
  bool use_mode(const Mode& m) {
    if (m.hopper && !kernels::sm90_device_available()) {
      std::printf("[path] %s: not an sm_90 device, the mode runs no Hopper kernel; skipped\n", m.what);
      return false;
    }
    gpu = backend_for(m);
    return true;
  }
  // The routes the router gives the parts of `blk` under `starts` (one sequence), both ways.
  void note_routes(const DocumentStarts& starts, const ops::AttentionBlock& blk, int64_t sq, int64_t sk, int64_t hq,
                   int64_t hkv, int64_t hd, bool f32_grads) {
    for (const DocumentPart& p : attention::document_parts(starts, blk, sq, sk)) {
      ops::AttentionCall c{1,   p.q_len, p.k_len,  hq,
                           hkv, hd,      p.causal, (blk.q_offset + p.q_row) - (blk.k_offset + p.k_row)};
      c.f32_grads = f32_grads;
      c.accumulate = blk.accumulate;
      fwd_routes_.insert(gpu->attention_route(c, false));
      bwd_routes_.insert(gpu->attention_route(c, true));
    }
  }
  void print_routes() {
    auto join = [](const std::set<std::string>& s) {
      std::string r;
      for (const auto& x : s) r += (r.empty() ? "" : ", ") + x;
      return r;
    };
    std::printf("[routes] %s: forward {%s}; backward {%s}\n", tag.c_str(), join(fwd_routes_).c_str(),
                join(bwd_routes_).c_str());
    fwd_routes_.clear();
    bwd_routes_.clear();
  }
  // lse: -inf exactly where the reference has -inf; elsewhere within 2e-3 nats.
  void expect_lse(const std::vector<float>& got, const std::vector<float>& want) { expect_lse_close(got, want, tag); }
  std::set<std::string> fwd_routes_, bwd_routes_;
};

// ---- LocalAttention over packed sequences.

struct LocalCase {
  int64_t hq, hkv, hd;
  std::vector<std::vector<int64_t>> lengths;  // per sequence: its documents' lengths (equal sums)
};
std::ostream& operator<<(std::ostream& os, const LocalCase& c) {
  os << "B" << c.lengths.size() << " S" << total(c.lengths[0]) << " Hq" << c.hq << " Hkv" << c.hkv << " hd" << c.hd
     << " docs";
  for (const auto& l : c.lengths) os << " " << l.size();
  return os;
}

struct LocalData {
  int64_t B, S;
  std::vector<DocumentStarts> docs;
  std::vector<float> q, k, v, dout, o, lse, dq, dk, dv;  // inputs, then the CPU reference's outputs
};

class CudaLocalDocuments : public CudaDocumentsTest, public ::testing::WithParamInterface<LocalCase> {
 protected:
  LocalData reference(const LocalCase& c);
  void run_mode(const LocalCase& c, const LocalData& d, const Mode& m);
};

LocalData CudaLocalDocuments::reference(const LocalCase& c) {
  LocalData d;
  d.B = static_cast<int64_t>(c.lengths.size());
  d.S = total(c.lengths[0]);
  for (const auto& l : c.lengths) {
    EXPECT_EQ(total(l), d.S);
    d.docs.push_back(starts_of(l));
  }
  const DType t = DType::BF16;
  const int64_t nq = d.B * d.S * c.hq * c.hd, nk = d.B * d.S * c.hkv * c.hd;
  d.q = rand(nq, t, -2, 2);
  d.k = rand(nk, t, -2, 2);
  d.v = rand(nk, t);
  d.dout = rand(nq, t);
  d.o.resize(static_cast<size_t>(nq));
  d.lse.resize(static_cast<size_t>(d.B * c.hq * d.S));
  d.dq.assign(static_cast<size_t>(nq), -3);
  d.dk.assign(static_cast<size_t>(nk), -3);
  d.dv.assign(static_cast<size_t>(nk), -3);
  attention::LocalAttention a(*cpu);
  auto hq = [&](std::vector<float>& x) { return host(x, {d.B, d.S, c.hq, c.hd}); };
  auto hk = [&](std::vector<float>& x) { return host(x, {d.B, d.S, c.hkv, c.hd}); };
  const attention::AttentionTensors ht{
      hq(d.q),      hk(d.k), hk(d.v), hq(d.o), host(d.lse, {d.B, c.hq, d.S}), 1 / std::sqrt(static_cast<double>(c.hd)),
      d.docs.data()};
  a.forward(ht);
  for (float& x : d.o) x = ops::bf16_to_float(ops::float_to_bf16(x));  // the backward's o: what the GPU holds
  a.backward(ht, {hq(d.dout), hq(d.dq), hk(d.dk), hk(d.dv)});
  return d;
}

void CudaLocalDocuments::run_mode(const LocalCase& c, const LocalData& d, const Mode& m) {
  tag = (std::ostringstream() << c << " [" << m.what << "]").str();
  const DType t = DType::BF16;
  const int64_t B = d.B, S = d.S;
  Buffer bq = upload(d.q, t), bk = upload(d.k, t), bv = upload(d.v, t),
         bo = gpu->alloc(t, static_cast<int64_t>(d.o.size())),
         bl = gpu->alloc(DType::F32, static_cast<int64_t>(d.lse.size()));
  poison(bo);
  poison(bl);
  auto qv = [&](const Buffer& x) { return x.view({B, S, c.hq, c.hd}); };
  auto kv = [&](const Buffer& x) { return x.view({B, S, c.hkv, c.hd}); };
  attention::LocalAttention a(*gpu);
  const double scale = 1 / std::sqrt(static_cast<double>(c.hd));
  a.forward({qv(bq), kv(bk), kv(bv), qv(bo), bl.view({B, c.hq, S}), scale, d.docs.data()});
  EXPECT_REL(download(bo), d.o, 1e-2);
  expect_lse(download(bl), d.lse);
  // The backward from the reference's o and lse (as test_cuda_attention), into poisoned gradients.
  Buffer bo2 = upload(d.o, t), bl2 = upload(d.lse, DType::F32), bdo = upload(d.dout, t);
  const attention::AttentionTensors gt{qv(bq), kv(bk), kv(bv), qv(bo2), bl2.view({B, c.hq, S}), scale, d.docs.data()};
  auto backward = [&](Buffer& dq, Buffer& dk, Buffer& dv) {
    dq = gpu->alloc(t, static_cast<int64_t>(d.dq.size()));
    dk = gpu->alloc(t, static_cast<int64_t>(d.dk.size()));
    dv = gpu->alloc(t, static_cast<int64_t>(d.dv.size()));
    poison(dq);
    poison(dk);
    poison(dv);
    a.backward(gt, {qv(bdo), qv(dq), kv(dk), kv(dv)});
  };
  Buffer dq, dk, dv;
  backward(dq, dk, dv);
  EXPECT_REL(download(dq), d.dq, 3e-2);
  EXPECT_REL(download(dk), d.dk, 3e-2);
  EXPECT_REL(download(dv), d.dv, 3e-2);
  if (m.deterministic) {  // bit-identical on a rerun
    Buffer dq2, dk2, dv2;
    backward(dq2, dk2, dv2);
    EXPECT_EQ(download_bits(dq2), download_bits(dq));
    EXPECT_EQ(download_bits(dk2), download_bits(dk));
    EXPECT_EQ(download_bits(dv2), download_bits(dv));
  }
  ops::AttentionBlock blk;
  blk.scale = scale;
  blk.accumulate = false;
  for (const DocumentStarts& s : d.docs) note_routes(s, blk, S, S, c.hq, c.hkv, c.hd, false);
  print_routes();
  std::printf("[path] last call %s: %s\n", tag.c_str(), ops::cuda_attention_path(*gpu).c_str());
}

TEST_P(CudaLocalDocuments, MatchesReference) {
  const LocalCase& c = GetParam();
  const LocalData d = reference(c);
  for (const Mode& m : kModes) {
    if (!m.graph && m.cudnn && longest(c.lengths) < 2048) continue;  // no document reaches query chunks
    if (!use_mode(m)) continue;
    SCOPED_TRACE(m.what);
    run_mode(c, d, m);
  }
}

INSTANTIATE_TEST_SUITE_P(Packed, CudaLocalDocuments,
                         ::testing::Values(LocalCase{8, 2, 128, {{1, 2, 17, 333, 500, 384}, {700, 1, 3, 64, 469}}},
                                           LocalCase{8, 2, 64, {{1, 2, 17, 333, 500, 384}, {700, 1, 3, 64, 469}}},
                                           // One document past 2048 tokens: cuDNN's causal graph or query chunks, the
                                           // backward in 1024 x 1024 tiles, the Hopper kernels at full length.
                                           LocalCase{8, 2, 64, {{5, 2500, 496}}},
                                           LocalCase{4, 4, 128, {{2047, 1, 953}}}),
                         [](const ::testing::TestParamInfo<LocalCase>& i) { return "case" + std::to_string(i.index); });

// ---- One block (a ring's step or a strategy's sub-block) of one sequence.

struct BlockCase {
  int64_t sq, sk, hq, hkv, hd;
  bool causal;
  int64_t q_off, k_off;
  std::vector<int64_t> lengths;  // the whole sequence's documents
};
std::ostream& operator<<(std::ostream& os, const BlockCase& c) {
  return os << "Sq" << c.sq << "@" << c.q_off << " Sk" << c.sk << "@" << c.k_off << " Hq" << c.hq << " Hkv" << c.hkv
            << " hd" << c.hd << (c.causal ? " causal" : " full") << " docs " << c.lengths.size();
}

class CudaBlockDocuments : public CudaDocumentsTest, public ::testing::WithParamInterface<BlockCase> {
 protected:
  void run_mode(const BlockCase& c, const Mode& m);
  void backward(const BlockCase& c, const ops::AttentionBlock& blk, DType gt);
  std::vector<float> q_, k_, v_, o_, lse_;
  DocumentStarts docs_;
  Buffer bq_, bk_, bv_;
};

void CudaBlockDocuments::run_mode(const BlockCase& c, const Mode& m) {
  tag = (std::ostringstream() << c << " [" << m.what << "]").str();
  const DType t = DType::BF16;
  docs_ = starts_of(c.lengths);
  const int64_t nq = c.sq * c.hq * c.hd, nk = c.sk * c.hkv * c.hd;
  q_ = rand(nq, t, -2, 2);
  k_ = rand(nk, t, -2, 2);
  v_ = rand(nk, t);
  ops::AttentionBlock blk;
  blk.scale = 1 / std::sqrt(static_cast<double>(c.hd));
  blk.causal = c.causal;
  blk.q_offset = c.q_off;
  blk.k_offset = c.k_off;
  blk.accumulate = true;
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
  expect_lse(download(bl), lse_);
  o_ = rounded(o_, t);
  for (DType gt : {DType::BF16, DType::F32}) backward(c, blk, gt);
  note_routes(docs_, blk, c.sq, c.sk, c.hq, c.hkv, c.hd, false);
  note_routes(docs_, blk, c.sq, c.sk, c.hq, c.hkv, c.hd, true);
  print_routes();
}

// Accumulates onto random starting gradients of type gt (bf16, or f32: a ring's accumulators).
void CudaBlockDocuments::backward(const BlockCase& c, const ops::AttentionBlock& blk, DType gt) {
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

TEST_P(CudaBlockDocuments, MatchesReference) {
  for (const Mode& m : kModes) {
    if (!m.graph && m.cudnn) continue;  // no causal square here: the same routes as "cudnn + FA2"
    if (!use_mode(m)) continue;
    SCOPED_TRACE(m.what);
    run_mode(GetParam(), m);
  }
}

INSTANTIATE_TEST_SUITE_P(Blocks, CudaBlockDocuments,
                         ::testing::Values(
                             // Queries [1500, 2200) after keys [200, 1100), causal false (a ring's off-diagonal step):
                             // document [1000, 1800) is a 300 x 100 rectangle; the queries of [1800, 2200) see no key.
                             BlockCase{700, 900, 8, 2, 128, false, 1500, 200, {150, 60, 1, 789, 800, 350, 50}},
                             // Overlapping ranges, causal false: rectangles 300 x 400, 1 x 1, 1 x 1, 535 x 298.
                             BlockCase{837, 1000, 8, 2, 64, false, 400, 0, {3, 297, 400, 1, 1, 335}},
                             // Causal with queries [600, 1237) after keys [0, 900): a causal part with a diagonal
                             // offset, causal squares of 17 and 2, 318 queries on 81 keys, 100 rows without keys.
                             BlockCase{637, 900, 8, 2, 128, true, 600, 0, {500, 300, 17, 2, 318, 100}}),
                         [](const ::testing::TestParamInfo<BlockCase>& i) { return "case" + std::to_string(i.index); });

}  // namespace
}  // namespace easyctx::test
