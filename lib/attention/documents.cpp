#include "attention/documents.h"

#include <algorithm>
#include <limits>

#include "attention/blocks.h"
#include "core/error.h"

namespace easyctx::attention {
using detail::seq_rows;
using ops::Tensor;

namespace {
void check_starts(const DocumentStarts& starts) {
  EASYCTX_CHECK(starts.empty() || starts[0] == 0, "document mask: the first document must start at position 0, not ",
                starts.empty() ? 0 : starts[0]);
  for (size_t d = 1; d < starts.size(); ++d)
    EASYCTX_CHECK(starts[d] > starts[d - 1], "document mask: document starts must increase; document ", d,
                  " starts at ", starts[d], " after ", starts[d - 1]);
}

// Document d's half-open range of positions (the last one runs to the end).
int64_t doc_end(const DocumentStarts& starts, size_t d) {
  return d + 1 < starts.size() ? starts[d + 1] : std::numeric_limits<int64_t>::max();
}

// The part of document [ds, de) in the block, or false when its queries see none of its keys.
bool part_of(int64_t ds, int64_t de, const ops::AttentionBlock& blk, int64_t sq, int64_t sk, DocumentPart* p) {
  int64_t qa = std::max(blk.q_offset, ds), qb = std::min(blk.q_offset + sq, de);
  const int64_t ka = std::max(blk.k_offset, ds);
  int64_t kb = std::min(blk.k_offset + sk, de);
  bool causal = false;
  if (blk.causal) {
    kb = std::min(kb, qb);  // no key after the last query
    qa = std::max(qa, ka);  // no query before the first key sees anything
    causal = kb - 1 > qa;   // some key after the first query: the diagonal runs through the part
  }
  if (qa >= qb || ka >= kb) return false;
  *p = {qa - blk.q_offset, qb - qa, ka - blk.k_offset, kb - ka, causal};
  return true;
}

ops::AttentionBlock part_block(const ops::AttentionBlock& blk, const DocumentPart& p) {
  ops::AttentionBlock b = blk;
  b.q_offset = blk.q_offset + p.q_row;
  b.k_offset = blk.k_offset + p.k_row;
  b.causal = p.causal;
  return b;
}

bool whole_block(const std::vector<DocumentPart>& parts, const ops::AttentionBlock& blk, int64_t sq, int64_t sk) {
  return parts.size() == 1 && parts[0] == DocumentPart{0, sq, 0, sk, blk.causal};
}

struct Covered {
  int64_t q = 0, k = 0;
};
Covered covered(const std::vector<DocumentPart>& parts) {
  Covered c;
  for (const DocumentPart& p : parts) {
    c.q += p.q_len;
    c.k += p.k_len;
  }
  return c;
}

void check_one_sequence(const Tensor& q) {
  EASYCTX_CHECK(q.ndim == 4 && q.dim(0) == 1, "document mask: one sequence per call ([1, S, H, hd]), got ",
                q.describe());
}

constexpr const char* kLseParts = "document mask LSE of a part";
}  // namespace

std::vector<DocumentPart> document_parts(const DocumentStarts& starts, const ops::AttentionBlock& blk, int64_t sq,
                                         int64_t sk) {
  check_starts(starts);
  std::vector<DocumentPart> parts;
  const DocumentStarts one{0};
  const DocumentStarts& s = starts.empty() ? one : starts;
  const int64_t lo = std::max(blk.q_offset, blk.k_offset), hi = std::min(blk.q_offset + sq, blk.k_offset + sk);
  // The first document that reaches `lo`; every later one that starts before `hi`.
  size_t d = static_cast<size_t>(std::upper_bound(s.begin(), s.end(), lo) - s.begin());
  for (d = d == 0 ? 0 : d - 1; d < s.size() && s[d] < hi; ++d) {
    DocumentPart p;
    if (part_of(s[d], doc_end(s, d), blk, sq, sk, &p)) parts.push_back(p);
  }
  return parts;
}

int64_t visible_pairs(const DocumentStarts& starts, int64_t q_begin, int64_t q_end, int64_t window) {
  check_starts(starts);
  const DocumentStarts one{0};
  const DocumentStarts& s = starts.empty() ? one : starts;
  const int64_t w = window > 0 ? window : std::numeric_limits<int64_t>::max();
  // sum of min(t, w) for t in [t0, t1]
  auto sum_min = [&](int64_t t0, int64_t t1) {
    if (t1 < t0) return int64_t{0};
    const int64_t a = std::min(t1, w);
    int64_t total = a >= t0 ? (t0 + a) * (a - t0 + 1) / 2 : 0;
    if (t1 > w) total += (t1 - std::max(t0 - 1, w)) * w;
    return total;
  };
  int64_t pairs = 0;
  for (size_t d = 0; d < s.size(); ++d) {
    const int64_t a = std::max(q_begin, s[d]), b = std::min(q_end, doc_end(s, d));
    if (a < b) pairs += sum_min(a - s[d] + 1, b - s[d]);  // query q sees min(q - start + 1, w) keys
  }
  return pairs;
}

std::vector<DocumentPart> visible_parts(const DocumentStarts* starts, const ops::AttentionBlock& blk, int64_t sq,
                                        int64_t sk) {
  std::vector<DocumentPart> parts = has_documents(starts) ? document_parts(*starts, blk, sq, sk)
                                                          : std::vector<DocumentPart>{{0, sq, 0, sk, blk.causal}};
  if (blk.window > 0)  // the part's last key at or before its first query's position - window: none in view
    parts.erase(std::remove_if(parts.begin(), parts.end(),
                               [&](const DocumentPart& p) {
                                 return blk.k_offset + p.k_row + p.k_len - 1 <= blk.q_offset + p.q_row - blk.window;
                               }),
                parts.end());
  return parts;
}

bool masked_attention_fwd(ops::Backend& be, const DocumentStarts* starts, const Tensor& q, const Tensor& k,
                          const Tensor& v, const ops::AttentionBlock& blk, const Tensor& o, const Tensor& lse) {
  const int64_t sq = q.dim(1), sk = k.dim(1);
  const bool masked = has_documents(starts) || blk.window > 0;
  const std::vector<DocumentPart> parts = masked ? visible_parts(starts, blk, sq, sk) : std::vector<DocumentPart>{};
  if (!masked || whole_block(parts, blk, sq, sk)) {
    be.attention_fwd(q, k, v, blk, o, lse);
    return true;
  }
  check_one_sequence(q);
  if (covered(parts).q < sq) {
    be.fill(o, 0);
    be.fill(lse, -std::numeric_limits<double>::infinity());
  }
  if (parts.empty()) return false;
  const int64_t H = q.dim(2);
  ops::Buffer lse_part = be.alloc(lse.dtype, H * sq, kLseParts);
  for (const DocumentPart& p : parts) {
    const Tensor lp = p.q_len == sq ? lse : lse_part.view({1, H, p.q_len});
    be.attention_fwd(seq_rows(q, p.q_row, p.q_len), seq_rows(k, p.k_row, p.k_len), seq_rows(v, p.k_row, p.k_len),
                     part_block(blk, p), seq_rows(o, p.q_row, p.q_len), lp);
    if (p.q_len != sq) be.copy_2d(lse.slice_flat(p.q_row, {(H - 1) * sq + p.q_len}), sq, lp, p.q_len, H, p.q_len);
  }
  return true;
}

void masked_attention_bwd(ops::Backend& be, const DocumentStarts* starts, const Tensor& q, const Tensor& k,
                          const Tensor& v, const Tensor& o, const Tensor& lse, const Tensor& dout,
                          const ops::AttentionBlock& blk, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const int64_t sq = q.dim(1), sk = k.dim(1);
  const bool masked = has_documents(starts) || blk.window > 0;
  const std::vector<DocumentPart> parts = masked ? visible_parts(starts, blk, sq, sk) : std::vector<DocumentPart>{};
  if (!masked || whole_block(parts, blk, sq, sk)) {
    be.attention_bwd(q, k, v, o, lse, dout, blk, dq, dk, dv);
    return;
  }
  check_one_sequence(q);
  const Covered c = covered(parts);
  if (!blk.accumulate && (c.q < sq || c.k < sk)) {
    be.fill(dq, 0);
    be.fill(dk, 0);
    be.fill(dv, 0);
  }
  if (parts.empty()) return;
  const int64_t H = q.dim(2);
  ops::Buffer lse_part = be.alloc(lse.dtype, H * sq, kLseParts);
  for (const DocumentPart& p : parts) {
    Tensor lp = lse;
    if (p.q_len != sq) {
      lp = lse_part.view({1, H, p.q_len});
      be.copy_2d(lp, p.q_len, lse.slice_flat(p.q_row, {(H - 1) * sq + p.q_len}), sq, H, p.q_len);
    }
    be.attention_bwd(seq_rows(q, p.q_row, p.q_len), seq_rows(k, p.k_row, p.k_len), seq_rows(v, p.k_row, p.k_len),
                     seq_rows(o, p.q_row, p.q_len), lp, seq_rows(dout, p.q_row, p.q_len), part_block(blk, p),
                     seq_rows(dq, p.q_row, p.q_len), seq_rows(dk, p.k_row, p.k_len), seq_rows(dv, p.k_row, p.k_len));
  }
}

}  // namespace easyctx::attention
