// Live and peak bytes of a backend's allocations. Shared (shared_ptr) with the deleters of
// the Buffers the backend hands out, since a Buffer may outlive its backend; thread-safe.
#pragma once
#include <atomic>
#include <cstdint>

namespace easyctx::ops {

class MemoryCounter {
 public:
  void add(int64_t bytes) {
    const int64_t now = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    int64_t p = peak_.load(std::memory_order_relaxed);
    while (now > p && !peak_.compare_exchange_weak(p, now, std::memory_order_relaxed)) {}
  }
  void sub(int64_t bytes) { live_.fetch_sub(bytes, std::memory_order_relaxed); }
  int64_t live() const { return live_.load(std::memory_order_relaxed); }
  int64_t peak() const { return peak_.load(std::memory_order_relaxed); }
  void reset_peak() { peak_.store(live(), std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> live_{0}, peak_{0};
};

}  // namespace easyctx::ops
