// ZeRO-3's gathered layers: a pool of 1 + prefetch buffers, each holding one layer unit
// gathered from the shards. The model announces the order of one forward/backward (begin),
// then acquires each layer just before using it and releases it after: acquire gathers the
// layer if no slot holds it, and the next `prefetch` layers of the order with it, into slots
// that are neither in use nor holding a layer of that window (the pool has one slot more than
// the window's other layers, so one always exists). A slot keeps its layer after release
// until the slot is needed again, so the last layer of the forward (and, across
// micro-batches, the first ones) are not gathered twice.
//
// On an asynchronous lane the gathers run beside compute: the layer that uses a slot waits
// for its gather (fence), the next gather into the slot waits for the slot's release, and
// every gather waits for the latest shards (shards_written()).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/fence.h"
#include "ops/ops.h"
#include "zero/comm_lane.h"

namespace easyctx::zero {

class GatherPool {
 public:
  // gather(u, dst): issues the gather of layer unit u into dst (on the lane's communicators);
  // before_gather(u): called once before a unit is gathered (a deferred update reaching it).
  GatherPool(ops::Backend& be, CommLane& lane, std::vector<ops::Buffer> slots, int prefetch,
             std::function<void(size_t, const ops::Buffer&)> gather, std::function<void(size_t)> before_gather);

  // The layer units of one forward/backward, in acquire order.
  void begin(const std::vector<size_t>& order);
  // Layer unit u (numel elements, in the announced order), ordered before the compute that follows.
  ops::Tensor acquire(size_t u, int64_t numel);
  void release(size_t u);
  // The shards changed (an optimizer step): every slot is stale, later gathers wait for the
  // compute issued so far (the writes of the new shards).
  void shards_written();
  // Every slot stale (the shards are being rewritten; later gathers are ordered by the caller).
  void invalidate();
  // How many gathers were issued, and whether a slot holds unit u (tests).
  int64_t gathers() const { return gathers_; }
  bool holds(size_t u) const;
  size_t slots() const { return slots_.size(); }

 private:
  static constexpr size_t kNone = static_cast<size_t>(-1);
  size_t ensure(size_t u);
  bool in_window(size_t unit) const;

  ops::Backend& be_;
  CommLane& lane_;
  std::vector<ops::Buffer> slots_;
  size_t prefetch_;
  std::function<void(size_t, const ops::Buffer&)> gather_;
  std::function<void(size_t)> before_gather_;
  std::vector<size_t> order_;
  size_t pos_ = 0;
  std::vector<size_t> unit_;         // per slot: the unit it holds (kNone: none)
  std::vector<bool> busy_;           // per slot: acquired and not released
  std::vector<Fence> ready_, free_;  // per slot: its last gather done; its last use done
  Fence shards_;                     // the latest shards written
  int64_t gathers_ = 0;
};

}  // namespace easyctx::zero
