// How one training window is laid out over the ranks of a sequence-parallel group, and the
// length it is padded to. Pure arithmetic in core (not in data or attention) because three
// modules need the same rule and may not depend on each other: the loader slices windows by
// it (data/sp_slice.h), the strategies' factory maps each mode to its layout
// (attention/strategy.h), and the memory plan sizes local buffers by it on a login node.
//   none        every rank gets the whole (unpadded) sequence.
//   contiguous  rank r gets chunk r of W equal chunks (padded to a multiple of W).
//   zigzag      2W equal chunks; rank r gets chunk r then chunk 2W-1-r (multiple of 2W).
//   usp         zigzag over the W/U ring ranks, then U contiguous parts of each ring rank's
//               two chunks (multiple of 2W; `inner` = U must divide W).
#pragma once
#include <cstdint>
#include <string>

namespace easyctx {

enum class SpLayout { None, Contiguous, Zigzag, Usp };

SpLayout parse_sp_layout(const std::string& name);  // "none" | "contiguous" | "zigzag" | "usp"
const char* sp_layout_name(SpLayout l);

// The padded sequence length is a multiple of this (1 for none).
int64_t sp_length_multiple(SpLayout layout, int world);
// Padded sequence length for L inputs over W ranks (`inner`: the Ulysses degree of usp,
// which must divide W; ignored by the other layouts).
int64_t sp_padded_length(int64_t L, SpLayout layout, int world, int inner = 1);
// Tokens per rank: sp_padded_length / W (L for none).
int64_t sp_local_length(int64_t L, SpLayout layout, int world, int inner = 1);

}  // namespace easyctx
