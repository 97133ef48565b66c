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
#include <sstream>

#include "attention_test_util.h"

namespace easyctx::test {
namespace {

using attention::DocumentPart;

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

class CudaDocumentsTest : public CudaAttentionTest {
 protected:
  // False (with a line saying why) for a Hopper mode on a device that is not sm_90.
  bool use_mode(const Mode& m) {
    ops::CudaBackendOptions o;
    o.cudnn_attention = m.cudnn;
    o.cudnn_causal_graph = m.graph;
    o.sm90_attention = m.hopper;
    o.deterministic = m.deterministic;
    o.attention_bwd_tile = m.tile;
    return use_backend(o, m.what);
  }
  // The routes the router gives the parts of `blk` under `starts` (one sequence), both ways.
  void note_routes(const DocumentStarts& starts, const ops::AttentionBlock& blk, int64_t sq, int64_t sk, int64_t hq,
                   int64_t hkv, int64_t hd, bool f32_grads) {
    for (const DocumentPart& p : attention::document_parts(starts, blk, sq, sk)) {
      ops::AttentionCall c{1,   p.q_len, p.k_len,  hq,
                           hkv, hd,      p.causal, (blk.q_offset + p.q_row) - (blk.k_offset + p.k_row)};
      c.f32_grads = f32_grads;
      c.accumulate = blk.accumulate;
      note_route(c);
    }
  }
  void print_routes() { std::printf("[routes] %s: %s\n", tag.c_str(), routes().c_str()); }
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

class CudaLocalDocuments : public CudaDocumentsTest, public ::testing::WithParamInterface<LocalCase> {
 protected:
  LocalData reference(const LocalCase& c);
  void run_mode(const LocalCase& c, const LocalData& d, const Mode& m);
};

LocalData CudaLocalDocuments::reference(const LocalCase& c) {
  LocalData d;
  d.B = static_cast<int64_t>(c.lengths.size());
  d.S = total(c.lengths[0]);
  d.hq = c.hq;
  d.hkv = c.hkv;
  d.hd = c.hd;
  for (const auto& l : c.lengths) {
    EXPECT_EQ(total(l), d.S);
    d.docs.push_back(starts_of(l));
  }
  local_reference(d);
  return d;
}

void CudaLocalDocuments::run_mode(const LocalCase& c, const LocalData& d, const Mode& m) {
  tag = (std::ostringstream() << c << " [" << m.what << "]").str();
  check_local(d, m.deterministic);
  ops::AttentionBlock blk;
  blk.scale = 1 / std::sqrt(static_cast<double>(c.hd));
  blk.accumulate = false;
  for (const DocumentStarts& s : d.docs) note_routes(s, blk, d.S, d.S, c.hq, c.hkv, c.hd, false);
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
  DocumentStarts docs_;
};

void CudaBlockDocuments::run_mode(const BlockCase& c, const Mode& m) {
  tag = (std::ostringstream() << c << " [" << m.what << "]").str();
  docs_ = starts_of(c.lengths);
  ops::AttentionBlock blk;
  blk.scale = 1 / std::sqrt(static_cast<double>(c.hd));
  blk.causal = c.causal;
  blk.q_offset = c.q_off;
  blk.k_offset = c.k_off;
  blk.accumulate = true;  // onto random bf16 and f32 starting gradients (a ring's accumulators)
  check_block({c.sq, c.sk, c.hq, c.hkv, c.hd}, docs_, blk);
  note_routes(docs_, blk, c.sq, c.sk, c.hq, c.hkv, c.hd, false);
  note_routes(docs_, blk, c.sq, c.sk, c.hq, c.hkv, c.hd, true);
  print_routes();
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
