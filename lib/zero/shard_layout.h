// ZeRO-3's cut of the parameters: unit u (model::ParamLayout) is split into Z equal shards of
// len(u) = ceil(numel / Z) elements (the last one padded with zeros); rank r owns elements
// [lo(u), lo(u) + valid(u)) of the unit. Used by the sharded parameter store, the memory plan
// and the checkpoint slices the shards write.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/param_layout.h"

namespace easyctx::zero {

class ShardLayout {
 public:
  // Z ranks in the shard group, this rank's index in it.
  ShardLayout(const model::ParamLayout& layout, int Z, int rank);

  int group_size() const { return Z_; }
  int rank() const { return rank_; }
  size_t units() const { return numel_.size(); }
  int64_t numel(size_t u) const { return numel_.at(u); }
  int64_t len(size_t u) const { return (numel(u) + Z_ - 1) / Z_; }
  int64_t lo(size_t u) const;
  int64_t valid(size_t u) const { return numel(u) - lo(u) < len(u) ? numel(u) - lo(u) : len(u); }
  // Sum over units of len(u): the elements of one rank's shards.
  int64_t total_len() const;
  // The largest len(u) over the units.
  int64_t max_len() const;

 private:
  std::vector<int64_t> numel_;
  int Z_, rank_;
};

}  // namespace easyctx::zero
