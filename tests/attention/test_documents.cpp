// Document masking (attention/documents.h): the parts of a block, checked by hand; and local
// attention over a packed sequence against each document run alone (its own tensors, plain
// causal attention, no document code): o, lse, dq, dk, dv of every row, fp64 and fp32.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "attention/documents.h"
#include "test_util.h"

using namespace easyctx;
using attention::DocumentPart;
using attention::DocumentStarts;
using ops::DType;
using ops::Tensor;

namespace {

ops::AttentionBlock block(int64_t q_offset, int64_t k_offset, bool causal) {
  ops::AttentionBlock b;
  b.scale = 0.5;
  b.q_offset = q_offset;
  b.k_offset = k_offset;
  b.causal = causal;
  return b;
}

}  // namespace

// Documents [0, 5) [5, 6) [6, 20) [20, ...).
TEST(DocumentParts, DiagonalBlockSplitsIntoCausalSquares) {
  const DocumentStarts s{0, 5, 6, 20};
  // Rows 4..11 on the diagonal: doc 0 row 4 (a 1x1 square: a full rectangle), doc 1 row 5,
  // doc 2 rows 6..11 (a causal square).
  const auto p = attention::document_parts(s, block(4, 4, true), 8, 8);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0], (DocumentPart{0, 1, 0, 1, false}));
  EXPECT_EQ(p[1], (DocumentPart{1, 1, 1, 1, false}));
  EXPECT_EQ(p[2], (DocumentPart{2, 6, 2, 6, true}));
}

TEST(DocumentParts, PastBlockKeepsSharedDocumentsOnly) {
  const DocumentStarts s{0, 5, 6, 20};
  // Queries 16..23 against keys 0..7: doc 2 (queries 16..19, keys 6..7); doc 3's queries have
  // no key here.
  const auto p = attention::document_parts(s, block(16, 0, false), 8, 8);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0], (DocumentPart{0, 4, 6, 2, false}));
  // Queries 24..31 against keys 8..15: doc 3 starts at 20, no shared document: nothing.
  EXPECT_TRUE(attention::document_parts(s, block(24, 8, false), 8, 8).empty());
  // One document over everything: the block itself.
  const auto whole = attention::document_parts(DocumentStarts{0}, block(24, 8, false), 8, 8);
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0], (DocumentPart{0, 8, 0, 8, false}));
}

TEST(DocumentParts, BadStartsAreRefused) {
  EXPECT_THROW(attention::document_parts(DocumentStarts{1, 4}, block(0, 0, true), 4, 4), Error);
  EXPECT_THROW(attention::document_parts(DocumentStarts{0, 4, 4}, block(0, 0, true), 4, 4), Error);
}

namespace {

template <typename T>
struct Run {
  std::vector<T> o, lse, dq, dk, dv;
};

// Local attention on q/k/v/dout [1, S, H, hd] (optionally under `docs`).
template <typename T>
Run<T> local(ops::Backend& be, std::vector<T> q, std::vector<T> k, std::vector<T> v, std::vector<T> dout, int64_t S,
             int64_t Hq, int64_t Hkv, int64_t hd, const DocumentStarts* docs) {
  constexpr DType dt = std::is_same<T, double>::value ? DType::F64 : DType::F32;
  Run<T> r{std::vector<T>(q.size()), std::vector<T>(static_cast<size_t>(Hq * S)), std::vector<T>(q.size(), T(-3)),
           std::vector<T>(k.size(), T(-3)), std::vector<T>(v.size(), T(-3))};
  auto t4 = [&](std::vector<T>& x, int64_t H) { return Tensor(x.data(), dt, {1, S, H, hd}); };
  attention::LocalAttention a(be);
  const attention::AttentionTensors t{
      t4(q, Hq), t4(k, Hkv), t4(v, Hkv), t4(r.o, Hq), Tensor(r.lse.data(), dt, {1, Hq, S}), 1 / std::sqrt(double(hd)),
      docs};
  a.forward(t);
  a.backward(t, {t4(dout, Hq), t4(r.dq, Hq), t4(r.dk, Hkv), t4(r.dv, Hkv)});
  return r;
}

// Rows [a, b) of a [S, H * hd] array (the lse: columns [a, b) of [H, S]).
template <typename T>
std::vector<T> rows(const std::vector<T>& x, int64_t a, int64_t b, int64_t width) {
  return std::vector<T>(x.begin() + a * width, x.begin() + b * width);
}
template <typename T>
std::vector<T> cols(const std::vector<T>& x, int64_t a, int64_t b, int64_t S, int64_t H) {
  std::vector<T> out;
  for (int64_t h = 0; h < H; ++h) out.insert(out.end(), x.begin() + h * S + a, x.begin() + h * S + b);
  return out;
}

template <typename T>
void packed_matches_documents_alone(double tol, const DocumentStarts& docs, int64_t S) {
  const int64_t Hq = 6, Hkv = 2, hd = 12;
  std::mt19937_64 rng(test::test_seed());
  auto q = test::random_vector<T>(static_cast<size_t>(S * Hq * hd), rng, -2, 2);
  auto k = test::random_vector<T>(static_cast<size_t>(S * Hkv * hd), rng, -2, 2);
  auto v = test::random_vector<T>(static_cast<size_t>(S * Hkv * hd), rng);
  auto dout = test::random_vector<T>(static_cast<size_t>(S * Hq * hd), rng);
  auto be = ops::make_cpu_backend();
  const Run<T> packed = local(*be, q, k, v, dout, S, Hq, Hkv, hd, &docs);
  const Run<T> causal = local(*be, q, k, v, dout, S, Hq, Hkv, hd, nullptr);
  EXPECT_GT(test::rel_error(packed.o, causal.o), 1e-3) << "the mask changed nothing";
  for (size_t d = 0; d < docs.size(); ++d) {
    const int64_t a = docs[d], b = d + 1 < docs.size() ? docs[d + 1] : S, n = b - a;
    const Run<T> alone = local(*be, rows(q, a, b, Hq * hd), rows(k, a, b, Hkv * hd), rows(v, a, b, Hkv * hd),
                               rows(dout, a, b, Hq * hd), n, Hq, Hkv, hd, nullptr);
    EXPECT_LE(test::rel_error(rows(packed.o, a, b, Hq * hd), alone.o), tol) << "o of document " << d;
    EXPECT_LE(test::rel_error(cols(packed.lse, a, b, S, Hq), alone.lse), tol) << "lse of document " << d;
    EXPECT_LE(test::rel_error(rows(packed.dq, a, b, Hq * hd), alone.dq), tol) << "dq of document " << d;
    EXPECT_LE(test::rel_error(rows(packed.dk, a, b, Hkv * hd), alone.dk), tol) << "dk of document " << d;
    EXPECT_LE(test::rel_error(rows(packed.dv, a, b, Hkv * hd), alone.dv), tol) << "dv of document " << d;
  }
}

}  // namespace

// Odd lengths, a one-token document, the last one running to the end; then documents of 5
// and 1 tokens.
TEST(DocumentMask, LocalPackedMatchesEachDocumentAloneF64) {
  packed_matches_documents_alone<double>(1e-12, {0, 7, 8, 21, 34}, 45);
  packed_matches_documents_alone<double>(1e-12, {0, 5, 10, 11, 15}, 20);
}
TEST(DocumentMask, LocalPackedMatchesEachDocumentAloneF32) {
  packed_matches_documents_alone<float>(1e-6, {0, 7, 8, 21, 34}, 45);
  packed_matches_documents_alone<float>(1e-6, {0, 5, 10, 11, 15}, 20);
}

namespace {

// Naive fp64 attention of one sequence under a sliding window (and optional documents): the
// definition, for the forward; the backward by central differences of sum(dout . o).
struct Naive {
  int64_t S, H, hd;
  double scale;
  int64_t window;
  DocumentStarts docs;
  bool sees(int64_t i, int64_t j) const {
    if (j > i || j <= i - window) return false;
    const int64_t di = std::upper_bound(docs.begin(), docs.end(), i) - docs.begin();
    const int64_t dj = std::upper_bound(docs.begin(), docs.end(), j) - docs.begin();
    return di == dj;
  }
  // o [S, H, hd], lse [H, S] of q [S, H, hd], k/v [S, 1, hd] (one kv head).
  void forward(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
               std::vector<double>& o, std::vector<double>& lse) const {
    o.assign(static_cast<size_t>(S * H * hd), 0);
    lse.assign(static_cast<size_t>(H * S), 0);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < S; ++i) {
        std::vector<double> sc(static_cast<size_t>(S), -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < S; ++j)
          if (sees(i, j)) {
            double d = 0;
            for (int64_t c = 0; c < hd; ++c) d += q[(i * H + h) * hd + c] * k[j * hd + c];
            sc[j] = d * scale;
            mx = std::max(mx, sc[j]);
          }
        double sum = 0;
        for (int64_t j = 0; j < S; ++j) sum += sees(i, j) ? std::exp(sc[j] - mx) : 0;
        for (int64_t j = 0; j < S; ++j)
          if (sees(i, j))
            for (int64_t c = 0; c < hd; ++c) o[(i * H + h) * hd + c] += std::exp(sc[j] - mx) / sum * v[j * hd + c];
        lse[h * S + i] = mx + std::log(sum);
      }
  }
};

}  // namespace

// A sliding window (Mistral's: a query sees itself and the window - 1 keys before it), alone
// and with documents: local attention against the naive definition (o, lse) and the gradients
// against central differences, fp64.
TEST(SlidingWindow, LocalMatchesTheDefinitionAndFiniteDifferences) {
  const int64_t S = 11, H = 2, hd = 4;
  std::mt19937_64 rng(test::test_seed());
  for (const DocumentStarts& docs : {DocumentStarts{0}, DocumentStarts{0, 4, 5}}) {
    const Naive nv{S, H, hd, 0.5, 3, docs};
    auto q = test::random_vector<double>(static_cast<size_t>(S * H * hd), rng, -2, 2);
    auto k = test::random_vector<double>(static_cast<size_t>(S * hd), rng, -2, 2);
    auto v = test::random_vector<double>(static_cast<size_t>(S * hd), rng);
    auto dout = test::random_vector<double>(static_cast<size_t>(S * H * hd), rng);
    auto be = ops::make_cpu_backend();
    std::vector<double> o(q.size()), lse(static_cast<size_t>(H * S)), dq(q.size()), dk(k.size()), dv(v.size());
    auto t4 = [&](std::vector<double>& x, int64_t h) { return Tensor(x.data(), DType::F64, {1, S, h, hd}); };
    attention::LocalAttention a(*be);
    const std::vector<DocumentStarts> per_seq{docs};
    const attention::AttentionTensors t{t4(q, H),
                                        t4(k, 1),
                                        t4(v, 1),
                                        t4(o, H),
                                        Tensor(lse.data(), DType::F64, {1, H, S}),
                                        nv.scale,
                                        docs.size() > 1 ? per_seq.data() : nullptr,
                                        nv.window};
    a.forward(t);
    a.backward(t, {t4(dout, H), t4(dq, H), t4(dk, 1), t4(dv, 1)});
    std::vector<double> want_o, want_lse;
    nv.forward(q, k, v, want_o, want_lse);
    EXPECT_LT(test::rel_error(o, want_o), 1e-12) << "o, documents " << docs.size();
    EXPECT_LT(test::rel_error(lse, want_lse), 1e-12) << "lse, documents " << docs.size();
    auto loss = [&] {
      std::vector<double> oo, ll;
      nv.forward(q, k, v, oo, ll);
      double s = 0;
      for (size_t i = 0; i < oo.size(); ++i) s += oo[i] * dout[i];
      return s;
    };
    for (auto [x, g, name] : {std::tuple{&q, &dq, "dq"}, std::tuple{&k, &dk, "dk"}, std::tuple{&v, &dv, "dv"}}) {
      std::vector<double> num(x->size());
      for (size_t i = 0; i < x->size(); ++i) {
        const double x0 = (*x)[i], h = 1e-5;
        (*x)[i] = x0 + h;
        const double up = loss();
        (*x)[i] = x0 - h;
        num[i] = (up - loss()) / (2 * h);
        (*x)[i] = x0;
      }
      EXPECT_LT(test::rel_error(*g, num), 1e-7) << name << ", documents " << docs.size();
    }
  }
}

// visible_pairs against counting every (query, key) pair: documents, windows, ranges.
TEST(DocumentMask, VisiblePairsCountEveryPair) {
  std::mt19937_64 rng(test::test_seed());
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t S = 40 + static_cast<int64_t>(rng() % 40);
    DocumentStarts docs{0};
    while (docs.back() + 1 < S && rng() % 4 != 0) docs.push_back(docs.back() + 1 + static_cast<int64_t>(rng() % 9));
    if (docs.back() >= S) docs.pop_back();
    const int64_t window = trial % 3 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % 12);
    const int64_t a = static_cast<int64_t>(rng() % S), b = a + static_cast<int64_t>(rng() % (S - a + 1));
    int64_t want = 0;
    for (int64_t q = a; q < b; ++q) {
      const int64_t start = *(std::upper_bound(docs.begin(), docs.end(), q) - 1);
      for (int64_t k = start; k <= q; ++k) want += window == 0 || k > q - window;
    }
    EXPECT_EQ(attention::visible_pairs(docs, a, b, window), want) << "trial " << trial;
  }
}

// The zigzag split's balance under packed documents (docs/data.md "Balance over
// sequence-parallel ranks"): 128K-token windows of documents of 2K-16K tokens, the query-key
// pairs of each rank's two chunks; the ranks' pairs add up to the window's. Prints the busiest
// rank's share of the mean, on average and at worst over 20 windows, for 2, 4 and 8 ranks.
TEST(DocumentMask, ZigzagWorkPerRankUnderDocuments) {
  std::mt19937_64 rng(test::test_seed());
  const int64_t L = 131072;
  for (int W : {2, 4, 8}) {
    double sum = 0, worst = 0;
    for (int trial = 0; trial < 20; ++trial) {
      DocumentStarts docs{0};
      for (;;) {
        const int64_t n = 2048 + static_cast<int64_t>(rng() % (16384 - 2048 + 1));
        if (docs.back() + n >= L) break;
        docs.push_back(docs.back() + n);
      }
      const int64_t c = L / (2 * W);
      std::vector<double> work;
      for (int r = 0; r < W; ++r) {
        int64_t pairs = 0;
        for (int64_t chunk : {static_cast<int64_t>(r), static_cast<int64_t>(2 * W - 1 - r)})
          pairs += attention::visible_pairs(docs, chunk * c, (chunk + 1) * c, 0);
        work.push_back(static_cast<double>(pairs));
      }
      const double total = std::accumulate(work.begin(), work.end(), 0.0);
      EXPECT_EQ(total, static_cast<double>(attention::visible_pairs(docs, 0, L, 0)));
      const double share = *std::max_element(work.begin(), work.end()) / (total / W);
      sum += share;
      worst = std::max(worst, share);
    }
    std::printf(
        "[balance] zigzag over %d ranks, 128K windows of 2K-16K documents: busiest rank %.2fx the mean "
        "on average, %.2fx at worst (20 windows)\n",
        W, sum / 20, worst);
  }
}
