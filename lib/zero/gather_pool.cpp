#include "zero/gather_pool.h"

#include <algorithm>

#include "core/error.h"

namespace easyctx::zero {

GatherPool::GatherPool(ops::Backend& be, CommLane& lane, std::vector<ops::Buffer> slots, int prefetch,
                       std::function<void(size_t, const ops::Buffer&)> gather,
                       std::function<void(size_t)> before_gather)
    : be_(be),
      lane_(lane),
      slots_(std::move(slots)),
      prefetch_(static_cast<size_t>(prefetch)),
      gather_(std::move(gather)),
      before_gather_(std::move(before_gather)),
      unit_(slots_.size(), kNone),
      busy_(slots_.size(), false),
      ready_(slots_.size()),
      free_(slots_.size()) {
  EASYCTX_CHECK(slots_.empty() || slots_.size() == prefetch_ + 1, "GatherPool: ", slots_.size(),
                " slots for a prefetch of ", prefetch_);  // (none: a model without layers)
}

void GatherPool::begin(const std::vector<size_t>& order) {
  order_ = order;
  pos_ = 0;
}

void GatherPool::invalidate() { std::fill(unit_.begin(), unit_.end(), kNone); }

void GatherPool::shards_written() {
  invalidate();
  shards_ = be_.record();
}

ops::Tensor GatherPool::acquire(size_t u, int64_t numel) {
  EASYCTX_CHECK(pos_ < order_.size() && order_[pos_] == u, "ZeRO-3: layer unit ", u,
                " acquired out of the announced order");
  const size_t s = ensure(u);
  busy_[s] = true;
  for (size_t k = 1; k <= prefetch_ && pos_ + k < order_.size(); ++k) ensure(order_[pos_ + k]);
  ++pos_;
  be_.wait(ready_[s]);
  return slots_[s].flat().slice_flat(0, {numel});
}

void GatherPool::release(size_t u) {
  for (size_t s = 0; s < unit_.size(); ++s)
    if (unit_[s] == u) {
      busy_[s] = false;
      if (lane_.async()) free_[s] = be_.record();
    }
}

bool GatherPool::holds(size_t u) const { return std::find(unit_.begin(), unit_.end(), u) != unit_.end(); }

bool GatherPool::in_window(size_t unit) const {
  for (size_t k = pos_; k <= pos_ + prefetch_ && k < order_.size(); ++k)
    if (order_[k] == unit) return true;
  return false;
}

size_t GatherPool::ensure(size_t u) {
  for (size_t s = 0; s < unit_.size(); ++s)
    if (unit_[s] == u) return s;
  before_gather_(u);
  for (size_t s = 0; s < unit_.size(); ++s) {
    if (busy_[s] || (unit_[s] != kNone && in_window(unit_[s]))) continue;
    unit_[s] = kNone;
    if (lane_.async()) lane_.queue().wait(free_[s]);  // the slot's last use is done
    ready_[s] = lane_.run(shards_, [&] { gather_(u, slots_[s]); });
    ++gathers_;
    unit_[s] = u;
    return s;
  }
  EASYCTX_THROW("ZeRO-3: no free slot in the pool of ", unit_.size(), " gathered layers");
}

}  // namespace easyctx::zero
