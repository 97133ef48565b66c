// Sequence-parallel slicing of one training window.
//
// A window w has L + 1 tokens: inputs x = w[0..L), labels y = w[1..L], positions 0..L-1.
// The sequence is padded to Lp (a multiple of W for `contiguous`, of 2W for `zigzag`, L for
// `none`): pad inputs get pad_id, label -1 (ignored by the loss) and positions L..Lp-1.
//   none        every rank gets the whole (unpadded) sequence.
//   contiguous  rank r gets chunk r of W equal chunks.
//   zigzag      the sequence is cut into 2W equal chunks; rank r gets chunk r followed by
//               chunk 2W-1-r (balances causal attention work across the ring).
//   usp         Ulysses inside x ring across (W = R x U, `inner` = U): zigzag over the R
//               ring ranks (ring rank k = r / U), then that 2-chunk sequence is cut into U
//               contiguous parts and rank r takes part r % U. Padded to a multiple of 2W.
// Positions are global (RoPE uses them), so a rank's slice is self-describing.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace easyctx::data {

enum class SpLayout { None, Contiguous, Zigzag, Usp };

SpLayout parse_sp_layout(const std::string& name);  // "none" | "contiguous" | "zigzag" | "usp"
const char* sp_layout_name(SpLayout l);

// Padded sequence length for L inputs over W ranks (`inner`: the Ulysses degree of usp,
// which must divide W; ignored by the other layouts).
int64_t sp_padded_length(int64_t L, SpLayout layout, int world, int inner = 1);
// Tokens per rank: sp_padded_length / W (L for none).
int64_t sp_local_length(int64_t L, SpLayout layout, int world, int inner = 1);

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
