// Sequence-parallel attention against single-rank attention on the whole sequence: every
// rank builds the same random q/k/v/dout, runs LocalAttention on all of it, takes its own
// tokens (zigzag or contiguous, as the loader slices them), runs the strategy, and compares
// o, lse, dq, dk, dv on its tokens. fp64 to 1e-10, fp32 to 1e-5 (relative norm error). The
// *WithDocuments cases pack documents into each sequence (data.document_mask) on both sides;
// local attention under documents is checked against each document alone in test_documents.
#include <gtest/gtest.h>

#include <numeric>

#include "attention/dist_flash.h"
#include "attention/head_grouped.h"
#include "attention/strategy.h"
#include "attention/ulysses.h"
#include "attention/zigzag_ring.h"
#include "core/config.h"
#include "data/sp_slice.h"
#include "dist/groups.h"
#include "test_util.h"

using namespace easyctx;
using ops::DType;
using ops::Tensor;

namespace {

struct Shape {
  int64_t B, S, Hq, Hkv, hd;
};

// Global token index of each local row for this rank.
std::vector<int64_t> zigzag_rows(int64_t S, int W, int r) {
  int64_t c = S / (2 * W);
  std::vector<int64_t> rows;
  for (int64_t ch : {static_cast<int64_t>(r), static_cast<int64_t>(2 * W - 1 - r)})
    for (int64_t i = 0; i < c; ++i) rows.push_back(ch * c + i);
  return rows;
}
std::vector<int64_t> contiguous_rows(const std::vector<int64_t>& all, int U, int u) {
  int64_t n = static_cast<int64_t>(all.size()) / U;
  return std::vector<int64_t>(all.begin() + u * n, all.begin() + (u + 1) * n);
}

template <typename T>
struct Case {
  Shape sh;
  std::vector<T> q, k, v, dout;  // full [B, S, H, hd]
};

template <typename T>
Case<T> make_case(const Shape& sh, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Case<T> c{sh, {}, {}, {}, {}};
  c.q = test::random_vector<T>(static_cast<size_t>(sh.B * sh.S * sh.Hq * sh.hd), rng, -2, 2);
  c.k = test::random_vector<T>(static_cast<size_t>(sh.B * sh.S * sh.Hkv * sh.hd), rng, -2, 2);
  c.v = test::random_vector<T>(static_cast<size_t>(sh.B * sh.S * sh.Hkv * sh.hd), rng);
  c.dout = test::random_vector<T>(static_cast<size_t>(sh.B * sh.S * sh.Hq * sh.hd), rng);
  return c;
}

// Rows `rows` of a full [B, S, H, hd] array.
template <typename T>
std::vector<T> take(const std::vector<T>& full, const Shape& sh, int64_t H, const std::vector<int64_t>& rows) {
  std::vector<T> out;
  for (int64_t b = 0; b < sh.B; ++b)
    for (int64_t r : rows)
      for (int64_t i = 0; i < H * sh.hd; ++i) out.push_back(full[static_cast<size_t>((b * sh.S + r) * H * sh.hd + i)]);
  return out;
}
template <typename T>
std::vector<T> take_lse(const std::vector<T>& full, const Shape& sh, const std::vector<int64_t>& rows) {
  std::vector<T> out;
  for (int64_t b = 0; b < sh.B; ++b)
    for (int64_t h = 0; h < sh.Hq; ++h)
      for (int64_t r : rows) out.push_back(full[static_cast<size_t>((b * sh.Hq + h) * sh.S + r)]);
  return out;
}

// Documents of sequence b of length S: odd lengths, a one-token one, crossing chunk borders.
std::vector<attention::DocumentStarts> documents(int64_t B, int64_t S) {
  std::vector<attention::DocumentStarts> d;
  for (int64_t b = 0; b < B; ++b)
    d.push_back(b % 2 == 0 ? attention::DocumentStarts{0, 3, 4, S / 3 + 2, S - 2}
                           : attention::DocumentStarts{0, S / 4, S / 2, S / 2 + 1, 3 * S / 4});  // at chunk borders
  return d;
}

template <typename T>
void run(attention::SequenceAttention& sp, const Shape& sh, const std::vector<int64_t>& rows, double tol, uint64_t seed,
         bool with_docs = false, int64_t window = 0) {
  const std::vector<attention::DocumentStarts> docs = documents(sh.B, sh.S);
  const attention::DocumentStarts* dp = with_docs ? docs.data() : nullptr;
  constexpr DType dt = std::is_same<T, double>::value ? DType::F64 : DType::F32;
  auto be = ops::make_cpu_backend();
  Case<T> c = make_case<T>(sh, seed);
  const double scale = 1.0 / std::sqrt(static_cast<double>(sh.hd));
  // Reference on the whole sequence.
  std::vector<T> o(c.q.size()), lse(static_cast<size_t>(sh.B * sh.Hq * sh.S)), dq(c.q.size()), dk(c.k.size()),
      dv(c.v.size());
  attention::LocalAttention local(*be);
  auto T4 = [&](std::vector<T>& x, int64_t S, int64_t H) { return Tensor(x.data(), dt, {sh.B, S, H, sh.hd}); };
  const attention::AttentionTensors whole{T4(c.q, sh.S, sh.Hq),
                                          T4(c.k, sh.S, sh.Hkv),
                                          T4(c.v, sh.S, sh.Hkv),
                                          T4(o, sh.S, sh.Hq),
                                          Tensor(lse.data(), dt, {sh.B, sh.Hq, sh.S}),
                                          scale,
                                          dp,
                                          window};
  local.forward(whole);
  local.backward(whole, {T4(c.dout, sh.S, sh.Hq), T4(dq, sh.S, sh.Hq), T4(dk, sh.S, sh.Hkv), T4(dv, sh.S, sh.Hkv)});
  // This rank's tokens.
  const int64_t Sl = static_cast<int64_t>(rows.size());
  auto q = take(c.q, sh, sh.Hq, rows), k = take(c.k, sh, sh.Hkv, rows), v = take(c.v, sh, sh.Hkv, rows),
       dout = take(c.dout, sh, sh.Hq, rows);
  std::vector<T> lo(q.size(), T(-7)), ll(static_cast<size_t>(sh.B * sh.Hq * Sl), T(-7)), ldq(q.size(), T(-7)),
      ldk(k.size(), T(-7)), ldv(v.size(), T(-7));  // poisoned
  const attention::AttentionTensors mine{T4(q, Sl, sh.Hq),
                                         T4(k, Sl, sh.Hkv),
                                         T4(v, Sl, sh.Hkv),
                                         T4(lo, Sl, sh.Hq),
                                         Tensor(ll.data(), dt, {sh.B, sh.Hq, Sl}),
                                         scale,
                                         dp,
                                         window};
  sp.forward(mine);
  const std::string what =
      std::string(with_docs ? " with documents" : "") + (window > 0 ? " with window " + std::to_string(window) : "");
  EXPECT_LT(test::rel_error(lo, take(o, sh, sh.Hq, rows)), tol) << sp.name() << what << " o";
  EXPECT_LT(test::rel_error(ll, take_lse(lse, sh, rows)), tol) << sp.name() << what << " lse";
  sp.backward(mine, {T4(dout, Sl, sh.Hq), T4(ldq, Sl, sh.Hq), T4(ldk, Sl, sh.Hkv), T4(ldv, Sl, sh.Hkv)});
  EXPECT_LT(test::rel_error(ldq, take(dq, sh, sh.Hq, rows)), tol) << sp.name() << what << " dq";
  EXPECT_LT(test::rel_error(ldk, take(dk, sh, sh.Hkv, rows)), tol) << sp.name() << what << " dk";
  EXPECT_LT(test::rel_error(ldv, take(dv, sh, sh.Hkv, rows)), tol) << sp.name() << what << " dv";
}

struct World {
  std::unique_ptr<dist::Runtime> rt;
  std::unique_ptr<dist::ProcessGroups> pg;
  uint64_t seed = 0;
};
World make_world(SeqParallelMode mode, int ulysses) {
  World w;
  int argc = 0;
  char** argv = nullptr;
  w.rt = std::make_unique<dist::Runtime>(&argc, &argv);
  StageConfig cfg;
  cfg.parallel.sequence.mode = mode;
  cfg.parallel.sequence.size = w.rt->size();
  cfg.parallel.sequence.ulysses_size = ulysses;
  auto L = dist::make_group_layout(cfg, w.rt->size(), w.rt->topology().local_size);
  w.pg = std::make_unique<dist::ProcessGroups>(*w.rt, L, dist::CommBackend::Mpi, 120.0);
  w.seed = test::test_seed();
  w.pg->world().broadcast(&w.seed, 1, 0);
  return w;
}

}  // namespace

TEST(SequenceParallel, ZigzagRingMatchesLocal) {
  World w = make_world(SeqParallelMode::ZigzagRing, 0);
  const int W = w.rt->size(), r = w.rt->rank();
  // Odd sizes: 5 tokens per chunk, GQA 6/2, head dim 12, batch 2.
  Shape sh{2, 2 * W * 5, 6, 2, 12};
  auto be = ops::make_cpu_backend();
  attention::ZigzagRingAttention z(*be, w.pg->ring());
  run<double>(z, sh, zigzag_rows(sh.S, W, r), 1e-10, w.seed);
  run<float>(z, sh, zigzag_rows(sh.S, W, r), 1e-5, w.seed + 1);
  run<double>(z, sh, zigzag_rows(sh.S, W, r), 1e-10, w.seed + 2, true);
  run<float>(z, sh, zigzag_rows(sh.S, W, r), 1e-5, w.seed + 3, true);
  // Sliding windows of 3 (blocks of 5 chunks apart skipped) and 7 tokens, with documents too.
  run<double>(z, sh, zigzag_rows(sh.S, W, r), 1e-10, w.seed + 4, false, 3);
  run<double>(z, sh, zigzag_rows(sh.S, W, r), 1e-10, w.seed + 5, true, 7);
}

// The zigzag ring's steps with a sliding window, against the definition: step s is kept iff on
// some rank a query token sees a key token of the visiting rank's chunks (key <= query, key >
// query - window). A window of at most one chunk keeps steps 0, 1 and W - 1 only (the K/V hop
// from step 1 straight to step W - 1); no window keeps them all.
TEST(SequenceParallel, ZigzagRingStepsSkipThoseOutsideTheWindow) {
  for (int W = 1; W <= 9; ++W)
    for (int64_t c : {1, 2, 5}) {
      auto chunk = [&](int rank, int i) { return i == 0 ? rank : 2 * W - 1 - rank; };
      for (int64_t window : {0, 1, 2, 3, 4, 5, 7, 11, 30}) {
        std::vector<int> want;
        for (int st = 0; st < W; ++st) {
          bool any = false;
          for (int r = 0; r < W; ++r)
            for (int qa = 0; qa < 2; ++qa)
              for (int kb = 0; kb < 2; ++kb)
                for (int64_t p = 0; p < c; ++p)
                  for (int64_t k = 0; k < c; ++k) {
                    const int64_t qp = chunk(r, qa) * c + p, kp = chunk((r - st + W) % W, kb) * c + k;
                    any = any || (kp <= qp && (window == 0 || kp > qp - window));
                  }
          if (any) want.push_back(st);
        }
        EXPECT_EQ(attention::ZigzagRingAttention::steps(W, c, window), want)
            << "W " << W << " chunk " << c << " window " << window;
      }
    }
  EXPECT_EQ(attention::ZigzagRingAttention::steps(8, 8192, 4096), (std::vector<int>{0, 1, 7}));
  EXPECT_EQ(attention::ZigzagRingAttention::steps(8, 8192, 0).size(), 8u);
}

TEST(SequenceParallel, UlyssesMatchesLocal) {
  World w = make_world(SeqParallelMode::Ulysses, 0);
  const int U = w.rt->size(), u = w.rt->rank();
  auto be = ops::make_cpu_backend();
  attention::UlyssesAttention uly(*be, w.pg->ulysses());
  std::vector<int64_t> all(static_cast<size_t>(U * 7));
  std::iota(all.begin(), all.end(), 0);
  // kv heads split across ranks (Hkv = U) and replicated (Hkv = 1).
  for (int64_t hkv : {static_cast<int64_t>(U), int64_t{1}}) {
    Shape sh{1, U * 7, 2 * U, hkv, 8};
    run<double>(uly, sh, contiguous_rows(all, U, u), 1e-10, w.seed + static_cast<uint64_t>(hkv));
    run<double>(uly, sh, contiguous_rows(all, U, u), 1e-10, w.seed + 7 + static_cast<uint64_t>(hkv), true);
    run<double>(uly, sh, contiguous_rows(all, U, u), 1e-10, w.seed + 9 + static_cast<uint64_t>(hkv), true, 5);
  }
}

TEST(SequenceParallel, UspMatchesLocal) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world % 2 != 0) GTEST_SKIP() << "usp needs an even group (ulysses 2 x ring W/2); world is " << world;
  World w = make_world(SeqParallelMode::Usp, 2);
  const int U = 2, R = world / 2, sp_rank = w.rt->rank();
  auto be = ops::make_cpu_backend();
  attention::UlyssesAttention usp(*be, w.pg->ulysses(),
                                  std::make_unique<attention::ZigzagRingAttention>(*be, w.pg->ring()));
  Shape sh{1, 2 * R * U * 3, 4, 2, 8};
  auto ring_rows = zigzag_rows(sh.S, R, sp_rank / U);
  run<double>(usp, sh, contiguous_rows(ring_rows, U, sp_rank % U), 1e-10, w.seed);
  run<double>(usp, sh, contiguous_rows(ring_rows, U, sp_rank % U), 1e-10, w.seed + 1, true);
  run<double>(usp, sh, contiguous_rows(ring_rows, U, sp_rank % U), 1e-10, w.seed + 2, false, 4);
}

TEST(SequenceParallel, DistFlashMatchesLocal) {
  World w = make_world(SeqParallelMode::DistFlash, 0);
  const int W = w.rt->size(), r = w.rt->rank();
  auto be = ops::make_cpu_backend();
  attention::DistFlashAttention df(*be, w.pg->ring());
  Shape sh{2, W * 9, 4, 2, 8};
  std::vector<int64_t> all(static_cast<size_t>(sh.S));
  std::iota(all.begin(), all.end(), 0);
  run<double>(df, sh, contiguous_rows(all, W, r), 1e-10, w.seed);
  run<float>(df, sh, contiguous_rows(all, W, r), 1e-5, w.seed + 1);
  run<double>(df, sh, contiguous_rows(all, W, r), 1e-10, w.seed + 2, true);
  run<float>(df, sh, contiguous_rows(all, W, r), 1e-5, w.seed + 3, true);
  run<double>(df, sh, contiguous_rows(all, W, r), 1e-10, w.seed + 4, false, 10);
  run<double>(df, sh, contiguous_rows(all, W, r), 1e-10, w.seed + 5, true, 4);
}

// activation.attention_head_groups: each strategy in G passes over head groups, against the
// whole sequence on one rank: the zigzag ring (G 2 of GQA 6/2, two q heads per kv head in each
// group) and Ulysses (G 2, U kv heads and 2U q heads per group), fp64 and fp32; and local
// attention in 3 groups bit-identical to one pass (heads are independent, so the packed passes
// do exactly the same arithmetic). A G that does not divide the kv heads is refused by name.
TEST(SequenceParallel, HeadGroupsMatchLocalRingAndLocal) {
  World w = make_world(SeqParallelMode::ZigzagRing, 0);
  const int W = w.rt->size(), r = w.rt->rank();
  auto be = ops::make_cpu_backend();
  {
    Shape sh{2, 2 * W * 5, 6, 2, 12};
    attention::HeadGroupedAttention z(*be, std::make_shared<attention::ZigzagRingAttention>(*be, w.pg->ring()), 2);
    run<double>(z, sh, zigzag_rows(sh.S, W, r), 1e-10, w.seed + 7);
    run<float>(z, sh, zigzag_rows(sh.S, W, r), 1e-5, w.seed + 8);
    run<double>(z, sh, zigzag_rows(sh.S, W, r), 1e-10, w.seed + 9, true);
    run<double>(z, sh, zigzag_rows(sh.S, W, r), 1e-10, w.seed + 10, true, 6);
  }
  // Local: 3 groups of GQA 6/3 against one pass, bit for bit.
  const Shape sh{2, 13, 6, 3, 8};
  Case<float> c = make_case<float>(sh, w.seed + 10);
  const double scale = 1.0 / std::sqrt(8.0);
  struct Out {
    std::vector<float> o, lse, dq, dk, dv;
  };
  auto run_local = [&](attention::SequenceAttention& a) {
    Out x{std::vector<float>(c.q.size(), -7.f), std::vector<float>(static_cast<size_t>(sh.B * sh.Hq * sh.S), -7.f),
          std::vector<float>(c.q.size(), -7.f), std::vector<float>(c.k.size(), -7.f),
          std::vector<float>(c.v.size(), -7.f)};
    auto T4 = [&](std::vector<float>& v, int64_t H) { return Tensor(v.data(), DType::F32, {sh.B, sh.S, H, sh.hd}); };
    const Tensor lse(x.lse.data(), DType::F32, {sh.B, sh.Hq, sh.S});
    const attention::AttentionTensors t{T4(c.q, sh.Hq), T4(c.k, sh.Hkv), T4(c.v, sh.Hkv), T4(x.o, sh.Hq), lse, scale};
    a.forward(t);
    a.backward(t, {T4(c.dout, sh.Hq), T4(x.dq, sh.Hq), T4(x.dk, sh.Hkv), T4(x.dv, sh.Hkv)});
    return x;
  };
  attention::LocalAttention one(*be);
  attention::HeadGroupedAttention three(*be, std::make_shared<attention::LocalAttention>(*be), 3);
  const Out a = run_local(one), b = run_local(three);
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
  attention::HeadGroupedAttention two(*be, std::make_shared<attention::LocalAttention>(*be), 2);
  try {
    run_local(two);
    FAIL() << "2 head groups of 3 kv heads were accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("activation.attention_head_groups: 2 does not divide the key/value heads (3)"),
              std::string::npos)
        << e.what();
  }
}

TEST(SequenceParallel, HeadGroupsMatchLocalUlysses) {
  World w = make_world(SeqParallelMode::Ulysses, 0);
  const int W = w.rt->size(), r = w.rt->rank();
  auto be = ops::make_cpu_backend();
  attention::HeadGroupedAttention uly(*be, std::make_shared<attention::UlyssesAttention>(*be, w.pg->ulysses()), 2);
  std::vector<int64_t> all(static_cast<size_t>(W * 7));
  std::iota(all.begin(), all.end(), 0);
  Shape sh{1, W * 7, 4 * W, 2 * W, 8};
  run<double>(uly, sh, contiguous_rows(all, W, r), 1e-10, w.seed + 9);
}

// The factory (attention/strategy.h) for every mode the world allows, with and without head
// groups, against one rank on the whole sequence: each strategy runs over the groups it
// needs, on the rows the loader gives this rank in the split's layout (data::sp_slice's
// positions of a window whose tokens are their positions).
TEST(SequenceParallel, FactoryStrategiesMatchLocalOnTheirLayout) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  for (SeqParallelMode mode :
       {SeqParallelMode::ZigzagRing, SeqParallelMode::Ulysses, SeqParallelMode::DistFlash, SeqParallelMode::Usp}) {
    if (mode == SeqParallelMode::Usp && W % 2 != 0) continue;
    const int ulysses = mode == SeqParallelMode::Usp ? 2 : 0;
    World w = make_world(mode, ulysses);
    const attention::SequenceSplit split = attention::sequence_split(w.pg->layout());
    const int64_t L = split.padded_length(5 * W + 1);
    std::vector<uint32_t> window(static_cast<size_t>(L + 1));
    std::iota(window.begin(), window.end(), 0u);
    const data::SpSlice mine =
        data::sp_slice(window.data(), L, split.layout, split.size, w.pg->sp().rank(), 0, split.inner);
    const std::vector<int64_t> rows(mine.positions.begin(), mine.positions.end());
    for (int64_t groups : {1, 2}) {
      StageConfig cfg;
      cfg.parallel.sequence.mode = mode;
      cfg.parallel.sequence.size = W;
      cfg.parallel.sequence.ulysses_size = ulysses;
      cfg.activation.attention_head_groups = groups;
      auto be = ops::make_cpu_backend();
      auto attn = attention::make_sequence_attention(cfg, *w.pg, *be);
      EXPECT_STREQ(attn->name(), to_string(mode));
      EXPECT_EQ(dynamic_cast<attention::HeadGroupedAttention*>(attn.get()) != nullptr, groups > 1);
      run<double>(*attn, Shape{2, L, 4 * W, 2 * W, 8}, rows, 1e-10, w.seed + static_cast<uint64_t>(groups));
    }
  }
}
