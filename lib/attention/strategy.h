// The one place that turns a stage's parallel.sequence.mode into a strategy and a data layout.
//
//  sequence_split()          pure (no backend, no communicator: the memory plan runs it on a
//                            login node): the layout the loader slices windows in, the
//                            multiple the sequence is padded to, the tokens per rank.
//  make_sequence_attention() the strategy, as the trainer runs it: local attention with one
//                            rank per sequence, else zigzag_ring / ulysses / dist_flash / usp
//                            over the process groups; wrapped in HeadGroupedAttention when
//                            activation.attention_head_groups > 1.
//
// The padding rule per layout is core/sp_layout.h's (the loader applies it from the layout).
#pragma once
#include <cstdint>
#include <memory>

#include "attention/attention.h"
#include "core/config.h"
#include "core/sp_layout.h"
#include "dist/comm.h"
#include "dist/groups.h"

namespace easyctx::attention {

// How one sequence is split over its sequence-parallel group.
struct SequenceSplit {
  SpLayout layout = SpLayout::None;
  int size = 1;   // ranks sharing one sequence (parallel.sequence.size)
  int inner = 1;  // the Ulysses degree (usp: inside the ring; ulysses: = size); the loader's sp_inner

  int64_t multiple() const { return sp_length_multiple(layout, size); }
  int64_t padded_length(int64_t seq_length) const { return sp_padded_length(seq_length, layout, size, inner); }
  int64_t local_length(int64_t seq_length) const { return sp_local_length(seq_length, layout, size, inner); }
};

// The layout a mode slices the sequence in, with more than one rank per sequence.
SpLayout layout_of(SeqParallelMode mode);
// From the group layout (dist::make_group_layout: mode, sizes); size 1: layout none.
SequenceSplit sequence_split(const dist::GroupLayout& groups);

// The communicators a strategy runs over: ProcessGroups' sp, ring and ulysses groups, or
// stand-ins with the same ranks and sizes (a replay on a recording backend).
struct SequenceComms {
  dist::Comm& sp;
  dist::Comm& ring;
  dist::Comm& ulysses;
};

// One rank per sequence: LocalAttention, in head groups when the config asks for them.
std::shared_ptr<SequenceAttention> make_local_attention(const StageConfig& cfg, ops::Backend& be);
// The stage's strategy (local attention when groups' sp size is 1). The strategy keeps
// references to `comms` and `be`: they must outlive it.
std::shared_ptr<SequenceAttention> make_sequence_attention(const StageConfig& cfg, const dist::GroupLayout& groups,
                                                           const SequenceComms& comms, ops::Backend& be);
std::shared_ptr<SequenceAttention> make_sequence_attention(const StageConfig& cfg, dist::ProcessGroups& groups,
                                                           ops::Backend& be);

}  // namespace easyctx::attention
