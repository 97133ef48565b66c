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
#include <vector>

#include "core/sp_layout.h"

namespace easyctx::data {

using easyctx::parse_sp_layout;
using easyctx::sp_layout_name;
using easyctx::SpLayout;
using easyctx::sp_local_length;
using easyctx::sp_padded_length;

struct SpSlice {
  std::vector<int32_t> tokens;     // [local_len]
  std::vector<int32_t> labels;     // [local_len], -1 = ignore
  std::vector<int32_t> positions;  // [local_len], global positions
  int64_t real_labels = 0;         // labels != -1 in this slice
};

// window: L + 1 ids. Appends this rank's slice to `out` (so a micro-batch of B windows is
// B consecutive slices). Throws Error when rank/world are invalid.
void sp_slice_append(const uint32_t* window, int64_t L, SpLayout layout, int world, int rank, int32_t pad_id,
                     SpSlice& out, int inner = 1);
SpSlice sp_slice(const uint32_t* window, int64_t L, SpLayout layout, int world, int rank, int32_t pad_id,
                 int inner = 1);

}  // namespace easyctx::data
