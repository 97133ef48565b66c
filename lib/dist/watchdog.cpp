#include "dist/watchdog.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/runtime.h"

namespace easyctx::dist {
namespace {

using Clock = std::chrono::steady_clock;

struct Slot {
  bool active = false;
  const char* op = nullptr;
  std::string group;
  size_t count = 0;
  double timeout_s = 0;
  Clock::time_point start;
};

// A device queue's unfinished fences, oldest first; `since` starts the oldest one's clock.
struct FenceLine {
  struct Item {
    Fence fence;
    std::string op, group;
    size_t count;
    double timeout_s;
  };
  std::deque<Item> items;
  Clock::time_point since;
};

class Watchdog {
 public:
  static Watchdog& instance() {
    static Watchdog* w = new Watchdog();  // never destroyed: the thread outlives static teardown
    return *w;
  }
  int enter(const char* op, const std::string& group, size_t count, double timeout_s) {
    std::lock_guard<std::mutex> lock(mu_);
    start_locked();
    for (size_t i = 0; i < slots_.size(); ++i)
      if (!slots_[i].active) {
        slots_[i] = Slot{true, op, group, count, timeout_s, Clock::now()};
        return static_cast<int>(i);
      }
    slots_.push_back(Slot{true, op, group, count, timeout_s, Clock::now()});
    return static_cast<int>(slots_.size() - 1);
  }
  void leave(int slot) {
    std::lock_guard<std::mutex> lock(mu_);
    slots_[static_cast<size_t>(slot)].active = false;
  }
  void watch(const void* queue, Fence f, const std::string& op, const std::string& group, size_t count,
             double timeout_s) {
    if (f.done()) return;
    std::lock_guard<std::mutex> lock(mu_);
    start_locked();
    FenceLine& line = lines_[queue];
    if (line.items.empty()) line.since = Clock::now();
    line.items.push_back({std::move(f), op, group, count, timeout_s});
  }

 private:
  void start_locked() {
    if (started_) return;
    started_ = true;
    std::thread([this] { loop(); }).detach();
  }
  static std::string timeout_message(const std::string& op, const std::string& group, size_t count, double timeout_s) {
    return op + " on group '" + group + "' (" + std::to_string(count) + " elements) did not complete within " +
           std::to_string(static_cast<long>(timeout_s)) +
           " s (parallel.collective_timeout_s): a peer rank has failed or is stuck; aborting all ranks";
  }
  void loop() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::string msg;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto now = Clock::now();
        for (const auto& s : slots_) {
          if (!s.active) continue;
          double el = std::chrono::duration<double>(now - s.start).count();
          if (el > s.timeout_s) {
            msg = timeout_message(s.op, s.group, s.count, s.timeout_s);
            break;
          }
        }
        for (auto& [queue, line] : lines_) {
          while (!line.items.empty() && line.items.front().fence.done()) {
            line.items.pop_front();
            line.since = now;
          }
          if (line.items.empty() || !msg.empty()) continue;
          const FenceLine::Item& it = line.items.front();
          if (std::chrono::duration<double>(now - line.since).count() > it.timeout_s)
            msg = timeout_message(it.op, it.group, it.count, it.timeout_s);
        }
      }
      if (!msg.empty()) abort_all(msg, 3);
    }
  }
  std::mutex mu_;
  std::vector<Slot> slots_;
  std::map<const void*, FenceLine> lines_;
  bool started_ = false;
};

}  // namespace

WatchdogGuard::WatchdogGuard(const char* op, const std::string& group, size_t count, double timeout_s)
    : slot_(Watchdog::instance().enter(op, group, count, timeout_s)) {}
WatchdogGuard::~WatchdogGuard() { Watchdog::instance().leave(slot_); }

void watch_fence(const void* queue, Fence f, const std::string& op, const std::string& group, size_t count,
                 double timeout_s) {
  Watchdog::instance().watch(queue, std::move(f), op, group, count, timeout_s);
}

}  // namespace easyctx::dist
