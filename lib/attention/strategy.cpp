#include "attention/strategy.h"

#include "attention/dist_flash.h"
#include "attention/head_grouped.h"
#include "attention/ulysses.h"
#include "attention/zigzag_ring.h"
#include "core/error.h"

namespace easyctx::attention {

SpLayout layout_of(SeqParallelMode mode) {
  switch (mode) {
    case SeqParallelMode::ZigzagRing: return SpLayout::Zigzag;
    case SeqParallelMode::Ulysses:
    case SeqParallelMode::DistFlash: return SpLayout::Contiguous;
    case SeqParallelMode::Usp: return SpLayout::Usp;  // zigzag over the ring, contiguous inside Ulysses
    case SeqParallelMode::None: break;
  }
  return SpLayout::None;
}

SequenceSplit sequence_split(const dist::GroupLayout& groups) {
  if (groups.sp_size == 1) return {};
  EASYCTX_CHECK_INPUT(groups.mode != SeqParallelMode::None, "parallel.sequence.mode: none with parallel.sequence.size ",
                      groups.sp_size);
  return {layout_of(groups.mode), groups.sp_size, groups.ulysses_size};
}

namespace {
std::shared_ptr<SequenceAttention> in_head_groups(const StageConfig& cfg, ops::Backend& be,
                                                  std::shared_ptr<SequenceAttention> attn) {
  const int64_t groups = cfg.activation.attention_head_groups;
  if (groups <= 1) return attn;
  return std::make_shared<HeadGroupedAttention>(be, std::move(attn), groups);
}
}  // namespace

std::shared_ptr<SequenceAttention> make_local_attention(const StageConfig& cfg, ops::Backend& be) {
  return in_head_groups(cfg, be, std::make_shared<LocalAttention>(be));
}

namespace {
// usp's Ulysses size and where it came from (a key, or the default that chose it), for the
// message when it does not divide the heads.
std::string usp_degree(const StageConfig& cfg, const dist::GroupLayout& groups) {
  const auto& sp = cfg.parallel.sequence;
  std::string from = sp.ring_degree > 0 ? "parallel.sequence.size " + std::to_string(sp.size) +
                                              " / parallel.sequence.ring_degree " + std::to_string(sp.ring_degree)
                     : sp.ulysses_size > 0 ? "parallel.sequence.ulysses_size"
                                           : "parallel.sequence.ulysses_size 0: the largest divisor of "
                                             "parallel.sequence.size " +
                                                 std::to_string(sp.size) + " that divides the ranks per node " +
                                                 std::to_string(groups.ranks_per_node);
  return "the Ulysses size " + std::to_string(groups.ulysses_size) + " (" + from + ")";
}
}  // namespace

std::shared_ptr<SequenceAttention> make_sequence_attention(const StageConfig& cfg, const dist::GroupLayout& groups,
                                                           const SequenceComms& comms, ops::Backend& be) {
  const SequenceSplit split = sequence_split(groups);
  if (split.size == 1) return make_local_attention(cfg, be);
  std::shared_ptr<SequenceAttention> attn;
  switch (groups.mode) {
    case SeqParallelMode::ZigzagRing: attn = std::make_shared<ZigzagRingAttention>(be, comms.ring); break;
    case SeqParallelMode::Ulysses: attn = std::make_shared<UlyssesAttention>(be, comms.ulysses); break;
    case SeqParallelMode::DistFlash: attn = std::make_shared<DistFlashAttention>(be, comms.sp); break;
    case SeqParallelMode::Usp:
      // Ulysses all-to-all inside each (contiguous) Ulysses group, zigzag ring across them.
      attn = std::make_shared<UlyssesAttention>(
          be, comms.ulysses, std::make_unique<ZigzagRingAttention>(be, comms.ring, /*inside_usp=*/true),
          usp_degree(cfg, groups));
      break;
    case SeqParallelMode::None: break;  // refused by sequence_split
  }
  return in_head_groups(cfg, be, std::move(attn));
}

std::shared_ptr<SequenceAttention> make_sequence_attention(const StageConfig& cfg, dist::ProcessGroups& groups,
                                                           ops::Backend& be) {
  return make_sequence_attention(cfg, groups.layout(), {groups.sp(), groups.ring(), groups.ulysses()}, be);
}

}  // namespace easyctx::attention
