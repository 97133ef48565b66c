// Document masking (attention/documents.h): the parts of a block, checked by hand; and local
// attention over a packed sequence against each document run alone (its own tensors, plain
// causal attention, no document code): o, lse, dq, dk, dv of every row, fp64 and fp32.
#include <gtest/gtest.h>

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
