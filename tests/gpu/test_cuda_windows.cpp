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
#include <sstream>

#include "attention_test_util.h"

namespace easyctx::test {
namespace {

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

class CudaWindowsTest : public CudaAttentionTest {
 protected:
  // False (with a line saying why) for a Hopper mode on a device that is not sm_90.
  bool use_mode(const Mode& m) {
    ops::CudaBackendOptions o;
    o.cudnn_attention = m.cudnn;
    o.sm90_attention = m.hopper;
    o.deterministic = m.deterministic;
    return use_backend(o, m.what);
  }
  void print_routes() {
    std::printf("[routes] %s: %s; last call %s\n", tag.c_str(), routes().c_str(),
                ops::cuda_attention_path(*gpu).c_str());
  }
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
  void run_mode(const LocalCase& c, const LocalData& d, const Mode& m);
};

TEST_P(CudaLocalWindows, MatchesReference) {
  const LocalCase& c = GetParam();
  int64_t total = 0;
  for (int64_t n : c.docs) total += n;
  ASSERT_TRUE(c.docs.empty() || total == c.S);
  LocalData d;
  d.B = c.B;
  d.S = c.S;
  d.hq = c.hq;
  d.hkv = c.hkv;
  d.hd = c.hd;
  d.window = c.window;
  d.docs.assign(static_cast<size_t>(c.B), c.docs.empty() ? DocumentStarts{0} : starts_of(c.docs));
  local_reference(d);
  for (const Mode& m : kModes) {
    if (!use_mode(m)) continue;
    SCOPED_TRACE(m.what);
    run_mode(c, d, m);
  }
}

void CudaLocalWindows::run_mode(const LocalCase& c, const LocalData& d, const Mode& m) {
  tag = (std::ostringstream() << c << " [" << m.what << "]").str();
  check_local(d, m.deterministic);
  ops::AttentionBlock blk;
  blk.scale = 1 / std::sqrt(static_cast<double>(c.hd));
  blk.window = c.window;
  blk.accumulate = false;
  for (const attention::DocumentPart& p : attention::visible_parts(&d.docs[0], blk, c.S, c.S)) {
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
  DocumentStarts docs_;
};

void CudaBlockWindows::run_mode(const BlockCase& c, const Mode& m) {
  tag = (std::ostringstream() << c << " [" << m.what << "]").str();
  docs_ = c.docs.empty() ? DocumentStarts{0} : starts_of(c.docs);
  ops::AttentionBlock blk;
  blk.scale = 1 / std::sqrt(static_cast<double>(c.hd));
  blk.causal = c.causal;
  blk.q_offset = c.q_off;
  blk.k_offset = c.k_off;
  blk.window = c.window;
  check_block({c.sq, c.sk, c.hq, c.hkv, c.hd}, docs_, blk);
  for (const attention::DocumentPart& p : attention::visible_parts(&docs_, blk, c.sq, c.sk)) {
    const int64_t diag = (c.q_off + p.q_row) - (c.k_off + p.k_row);
    ops::AttentionCall call{1, p.q_len, p.k_len, c.hq, c.hkv, c.hd, p.causal, diag};
    call.window = ops::effective_window(c.window, p.q_len, p.k_len, diag);
    note_route(call);
  }
  print_routes();
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
