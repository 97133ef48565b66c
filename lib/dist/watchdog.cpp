#include "dist/watchdog.h"

#include <chrono>
#include <condition_variable>
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

class Watchdog {
 public:
  static Watchdog& instance() {
    static Watchdog* w = new Watchdog();  // never destroyed: the thread outlives static teardown
    return *w;
  }
  int enter(const char* op, const std::string& group, size_t count, double timeout_s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_) {
      started_ = true;
      std::thread([this] { loop(); }).detach();
    }
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

 private:
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
            msg = std::string(s.op) + " on group '" + s.group + "' (" + std::to_string(s.count) +
                  " elements) did not complete within " + std::to_string(static_cast<long>(s.timeout_s)) +
                  " s (parallel.collective_timeout_s): a peer rank has failed or is stuck; aborting all ranks";
            break;
          }
        }
      }
      if (!msg.empty()) abort_all(msg, 3);
    }
  }
  std::mutex mu_;
  std::vector<Slot> slots_;
  bool started_ = false;
};

}  // namespace

WatchdogGuard::WatchdogGuard(const char* op, const std::string& group, size_t count, double timeout_s)
    : slot_(Watchdog::instance().enter(op, group, count, timeout_s)) {}
WatchdogGuard::~WatchdogGuard() { Watchdog::instance().leave(slot_); }

}  // namespace easyctx::dist
