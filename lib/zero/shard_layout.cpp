#include "zero/shard_layout.h"

#include <algorithm>

#include "core/error.h"

namespace easyctx::zero {

ShardLayout::ShardLayout(const model::ParamLayout& layout, int Z, int rank) : Z_(Z), rank_(rank) {
  EASYCTX_CHECK(Z >= 1 && rank >= 0 && rank < Z, "ShardLayout: rank ", rank, " of a shard group of ", Z);
  for (const model::ParamUnit& u : layout.units()) numel_.push_back(u.numel);
}

int64_t ShardLayout::lo(size_t u) const { return std::min(numel(u), rank_ * len(u)); }

int64_t ShardLayout::total_len() const {
  int64_t s = 0;
  for (size_t u = 0; u < units(); ++u) s += len(u);
  return s;
}

int64_t ShardLayout::max_len() const {
  int64_t m = 0;
  for (size_t u = 0; u < units(); ++u) m = std::max(m, len(u));
  return m;
}

}  // namespace easyctx::zero
