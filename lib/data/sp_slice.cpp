#include "data/sp_slice.h"

#include <algorithm>

#include "core/error.h"

namespace easyctx::data {

namespace {
// Appends padded positions [begin, end) of the sequence.
void append_range(const uint32_t* w, int64_t L, int64_t begin, int64_t end, int32_t pad_id, SpSlice& out) {
  for (int64_t p = begin; p < end; ++p) {
    bool real = p < L;
    out.tokens.push_back(real ? static_cast<int32_t>(w[p]) : pad_id);
    out.labels.push_back(real ? static_cast<int32_t>(w[p + 1]) : -1);
    out.positions.push_back(static_cast<int32_t>(p));
    out.real_labels += real ? 1 : 0;
  }
}
}  // namespace

std::vector<std::pair<int64_t, int64_t>> sp_rank_ranges(int64_t L, SpLayout layout, int world, int rank, int inner) {
  EASYCTX_CHECK(world > 0 && rank >= 0 && rank < world, "sp_slice: rank ", rank, " outside world ", world);
  EASYCTX_CHECK(L < (int64_t(1) << 31), "sp_slice: sequence length ", L, " does not fit int32 positions");
  const int64_t Lp = sp_padded_length(L, layout, world, inner);
  std::vector<std::pair<int64_t, int64_t>> r;
  switch (layout) {
    case SpLayout::None: r.emplace_back(0, L); break;
    case SpLayout::Contiguous: {
      int64_t c = Lp / world;
      r.emplace_back(rank * c, (rank + 1) * c);
      break;
    }
    case SpLayout::Zigzag: {
      int64_t c = Lp / (2 * int64_t(world));
      int64_t second = 2 * int64_t(world) - 1 - rank;
      r.emplace_back(rank * c, (rank + 1) * c);
      r.emplace_back(second * c, (second + 1) * c);
      break;
    }
    case SpLayout::Usp: {
      // Zigzag over R = world / inner ring ranks, then part (rank % inner) of that rank's
      // 2c tokens; a part may straddle the two chunks.
      const int64_t R = world / inner, k = rank / inner, u = rank % inner;
      const int64_t c = Lp / (2 * R), part = 2 * c / inner;
      const int64_t first = k * c, second = (2 * R - 1 - k) * c;
      const int64_t b = u * part, e = (u + 1) * part;  // in the rank's 2c-token sequence
      if (b < c) r.emplace_back(first + b, first + std::min(e, c));
      if (e > c) r.emplace_back(second + std::max<int64_t>(b - c, 0), second + (e - c));
      break;
    }
  }
  return r;
}

void sp_slice_append(const uint32_t* window, int64_t L, SpLayout layout, int world, int rank, int32_t pad_id,
                     SpSlice& out, int inner) {
  for (const auto& [b, e] : sp_rank_ranges(L, layout, world, rank, inner)) append_range(window, L, b, e, pad_id, out);
  out.doc_starts.push_back({0});
}

void sp_slice_sequence_append(const SpSequence& seq, int64_t L, SpLayout layout, int world, int rank, SpSlice& out,
                              int inner) {
  const int64_t Lp = sp_padded_length(L, layout, world, inner);
  EASYCTX_CHECK(static_cast<int64_t>(seq.tokens.size()) == Lp && seq.labels.size() == seq.tokens.size() &&
                    seq.positions.size() == seq.tokens.size(),
                "sp_slice: a built sequence has ", seq.tokens.size(), " tokens, expected the padded length ", Lp);
  for (const auto& [b, e] : sp_rank_ranges(L, layout, world, rank, inner)) {
    for (int64_t p = b; p < e; ++p) {
      out.tokens.push_back(seq.tokens[p]);
      out.labels.push_back(seq.labels[p]);
      out.positions.push_back(seq.positions[p]);
      out.real_labels += seq.labels[p] != -1 ? 1 : 0;
    }
  }
  out.doc_starts.push_back(seq.doc_starts);
}

SpSlice sp_slice(const uint32_t* window, int64_t L, SpLayout layout, int world, int rank, int32_t pad_id, int inner) {
  SpSlice s;
  sp_slice_append(window, L, layout, world, rank, pad_id, s, inner);
  return s;
}

}  // namespace easyctx::data
