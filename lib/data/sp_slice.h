// Sequence-parallel slicing of one training window.
//
// A window w has L + 1 tokens: inputs x = w[0..L), labels y = w[1..L], positions 0..L-1.
// The sequence is padded to Lp (core/sp_layout.h: the layouts and the padding rule): pad
// inputs get pad_id, label -1 (ignored by the loss) and positions L..Lp-1. In `usp` a ring
// rank's part may straddle its two chunks.
// Positions are global (RoPE uses them), so a rank's slice is self-describing.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/sp_layout.h"

namespace easyctx::data {

using easyctx::parse_sp_layout;
using easyctx::sp_layout_name;
using easyctx::sp_local_length;
using easyctx::sp_padded_length;
using easyctx::SpLayout;

struct SpSlice {
  std::vector<int32_t> tokens;     // [local_len]
  std::vector<int32_t> labels;     // [local_len], -1 = ignore
  std::vector<int32_t> positions;  // [local_len], global positions
  int64_t real_labels = 0;         // labels != -1 in this slice
  // Per appended sequence: the offsets where its documents start, in coordinates of the
  // whole padded sequence [0, Lp) (first entry 0, increasing). Every SP rank gets the same
  // list for a sequence, not only the starts inside its own chunks: a ring/zigzag rank
  // attends to key chunks of the other ranks and needs their boundaries too; its own chunk
  // offsets follow from the layout (sp_rank_ranges). {0}: the sequence is one document.
  std::vector<std::vector<int64_t>> doc_starts;
};

// The half-open ranges of padded positions [0, Lp) that `rank` holds, in the order its slice
// lists them (Lp = sp_padded_length(L, ...)).
std::vector<std::pair<int64_t, int64_t>> sp_rank_ranges(int64_t L, SpLayout layout, int world, int rank, int inner = 1);

// One sequence built in full before slicing (packed documents, loss weights, per-document
// positions): tokens, labels and positions have Lp = sp_padded_length(L, ...) entries,
// padding included; doc_starts as in SpSlice.
struct SpSequence {
  std::vector<int32_t> tokens, labels, positions;
  std::vector<int64_t> doc_starts;
};
// Appends this rank's slice of `seq` (its ranges of every array) and seq.doc_starts whole.
void sp_slice_sequence_append(const SpSequence& seq, int64_t L, SpLayout layout, int world, int rank, SpSlice& out,
                              int inner = 1);

// window: L + 1 ids. Appends this rank's slice to `out` (so a micro-batch of B windows is
// B consecutive slices) and doc_starts {0}. Throws Error when rank/world are invalid.
void sp_slice_append(const uint32_t* window, int64_t L, SpLayout layout, int world, int rank, int32_t pad_id,
                     SpSlice& out, int inner = 1);
SpSlice sp_slice(const uint32_t* window, int64_t L, SpLayout layout, int world, int rank, int32_t pad_id,
                 int inner = 1);

}  // namespace easyctx::data
