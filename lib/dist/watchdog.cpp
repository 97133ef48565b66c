#include "dist/watchdog.h"

#include <csignal>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/strings.h"
#include "dist/runtime.h"

namespace easyctx::dist {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int world_rank() {
  int init = 0, fin = 0, r = -1;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

std::string seconds_text(double s) {
  if (s >= 10 || s == static_cast<double>(static_cast<long>(s))) return std::to_string(static_cast<long>(s));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", s);
  return buf;
}

// ---- default timeout -------------------------------------------------------------------

double& default_timeout() {
  static double t = [] {
    const char* e = std::getenv("EASYCTX_COLLECTIVE_TIMEOUT_S");
    if (e && *e) {
      char* end = nullptr;
      double v = std::strtod(e, &end);
      if (end && *end == '\0' && v > 0) return v;
    }
    return 600.0;
  }();
  return t;
}

// ---- roll calls --------------------------------------------------------------------------

constexpr int kQueryTag = 7301, kReplyTag = 7302;

// What a rank answers: the watched operation it waits in, if any.
struct Reply {
  int waiting = 0;  // 1: in a watched operation
  long seq = 0;
  double waited_s = 0;
  char op[48] = {0};
  char group[48] = {0};
};

struct RollCall {
  MPI_Comm comm = MPI_COMM_NULL;
  std::vector<std::string> hosts;
  // This rank's current watched operation (main thread only, MPI_THREAD_FUNNELED).
  bool waiting = false;
  const char* op = "";
  std::string group;
  long seq = 0;
  Clock::time_point since;
  // Replies in flight (Isend buffers must live until complete).
  std::deque<std::pair<Reply, MPI_Request>> sends;
  int query = 0;
};
RollCall& rc() {
  static RollCall* r = new RollCall();  // never destroyed (used during abort)
  return *r;
}

std::string host_of(int rank) {
  const auto& h = rc().hosts;
  return rank >= 0 && static_cast<size_t>(rank) < h.size() ? h[static_cast<size_t>(rank)] : std::string();
}

std::string rank_name(int rank) {
  const std::string h = host_of(rank);
  return "rank " + std::to_string(rank) + (h.empty() ? "" : " (" + h + ")");
}

void copy_text(char* dst, size_t n, const std::string& s) {
  std::strncpy(dst, s.c_str(), n - 1);
  dst[n - 1] = '\0';
}

// Runs a roll call over `members` (world ranks) for up to `grace` seconds and describes it.
std::string roll_call(const Watch& w, double grace) {
  RollCall& r = rc();
  const int me = world_rank();
  if (r.comm == MPI_COMM_NULL || !w.members || w.members->size() < 2) return "a peer rank has failed or is stuck";
  std::vector<int> others;
  for (int m : *w.members)
    if (m != me) others.push_back(m);
  std::vector<MPI_Request> qs(others.size(), MPI_REQUEST_NULL);
  for (size_t i = 0; i < others.size(); ++i) MPI_Isend(&r.query, 1, MPI_INT, others[i], kQueryTag, r.comm, &qs[i]);
  std::map<int, Reply> got;
  const auto start = Clock::now();
  while (got.size() < others.size() && seconds_since(start) < grace) {
    answer_roll_calls();
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kReplyTag, r.comm, &flag, &st) == MPI_SUCCESS && flag) {
      Reply rep;
      MPI_Recv(&rep, sizeof rep, MPI_BYTE, st.MPI_SOURCE, kReplyTag, r.comm, MPI_STATUS_IGNORE);
      got[st.MPI_SOURCE] = rep;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<std::string> silent, elsewhere, behind;
  for (int o : others) {
    auto it = got.find(o);
    if (it == got.end() || !it->second.waiting) {
      silent.push_back(rank_name(o));
      continue;
    }
    const Reply& rep = it->second;
    if (w.op == std::string(rep.op) && w.group == rep.group) {
      if (w.seq && rep.seq != w.seq)
        behind.push_back(rank_name(o) + " is in its #" + std::to_string(rep.seq) + " " + rep.op + " (this rank: #" +
                         std::to_string(w.seq) + ")");
      continue;
    }
    elsewhere.push_back(rank_name(o) + " waits in " + rep.op + " on group '" + rep.group + "' (#" +
                        std::to_string(rep.seq) + ", for " + seconds_text(rep.waited_s) + " s)");
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    const size_t shown = std::min<size_t>(v.size(), 8);
    for (size_t i = 0; i < shown; ++i) s += (i ? ", " : "") + v[i];
    if (v.size() > shown) s += " and " + std::to_string(v.size() - shown) + " more";
    return s;
  };
  std::string msg;
  if (!silent.empty())
    msg += list(silent) + (silent.size() == 1 ? " has" : " have") +
           " not reached it (no answer: stalled outside any collective, or dead)";
  if (!elsewhere.empty())
    msg += (msg.empty() ? "" : "; ") + list(elsewhere) + ": the ranks call collectives in a different order";
  if (!behind.empty()) msg += (msg.empty() ? "" : "; ") + list(behind) + ": a rank skipped or repeated a collective";
  if (msg.empty()) msg = "every rank of the group is waiting in it: the network or MPI itself is stuck";
  return msg;
}

// ---- fault injection ---------------------------------------------------------------------

struct Fault {
  bool on = false;
  std::string action, op, group;
  int rank = -1;
  long nth = 1, seen = 0;
};
Fault& fault() {
  static Fault f = [] {
    Fault x;
    const char* e = std::getenv("EASYCTX_FAULT");
    if (!e || !*e) return x;
    const std::vector<std::string> p = split(e, ':');
    if (p.size() < 3) return x;
    x.on = true;
    x.action = p[0];
    x.rank = std::atoi(p[1].c_str());
    x.op = p[2];
    x.group = p.size() > 3 ? p[3] : "*";
    x.nth = p.size() > 4 ? std::max(1L, std::atol(p[4].c_str())) : 1;
    return x;
  }();
  return f;
}

// ---- the monitor thread (guards and fences) ----------------------------------------------

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
  void loop() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::string msg;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto now = Clock::now();
        for (const auto& s : slots_) {
          if (!s.active || s.timeout_s <= 0) continue;
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
          if (it.timeout_s > 0 && std::chrono::duration<double>(now - line.since).count() > it.timeout_s)
            msg = timeout_message(it.op, it.group, it.count, it.timeout_s);
        }
      }
      if (!msg.empty()) abort_all(msg + ": a peer rank has failed or is stuck; aborting all ranks", 3);
    }
  }
  std::mutex mu_;
  std::vector<Slot> slots_;
  std::map<const void*, FenceLine> lines_;
  bool started_ = false;
};

}  // namespace

double default_collective_timeout_s() { return default_timeout(); }
void set_default_collective_timeout_s(double seconds) {
  if (seconds > 0) default_timeout() = seconds;
}

std::string timeout_message(const std::string& op, const std::string& group, size_t count, double timeout_s) {
  const int me = world_rank();
  return op + " on group '" + group + "' (" + std::to_string(count) + " elements) did not complete within " +
         seconds_text(timeout_s) + " s (parallel.collective_timeout_s)" +
         (me >= 0 ? " on rank " + std::to_string(me) : std::string());
}

void set_roll_call_comm(MPI_Comm comm, std::vector<std::string> hosts) {
  rc().comm = comm;
  rc().hosts = std::move(hosts);
}

void clear_roll_call_comm() {
  RollCall& r = rc();
  for (auto& [rep, req] : r.sends)
    if (req != MPI_REQUEST_NULL) MPI_Request_free(&req);
  r.sends.clear();
  r.comm = MPI_COMM_NULL;
}

void answer_roll_calls() {
  RollCall& r = rc();
  if (r.comm == MPI_COMM_NULL) return;
  while (!r.sends.empty()) {  // replies sent earlier
    int done = 0;
    MPI_Test(&r.sends.front().second, &done, MPI_STATUS_IGNORE);
    if (!done) break;
    r.sends.pop_front();
  }
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, r.comm, &flag, &st) != MPI_SUCCESS || !flag) return;
    int q = 0;
    MPI_Recv(&q, 1, MPI_INT, st.MPI_SOURCE, kQueryTag, r.comm, MPI_STATUS_IGNORE);
    r.sends.emplace_back();
    Reply& rep = r.sends.back().first;
    rep.waiting = r.waiting ? 1 : 0;
    rep.seq = r.seq;
    rep.waited_s = r.waiting ? seconds_since(r.since) : 0;
    copy_text(rep.op, sizeof rep.op, r.op ? r.op : "");
    copy_text(rep.group, sizeof rep.group, r.group);
    MPI_Isend(&rep, sizeof rep, MPI_BYTE, st.MPI_SOURCE, kReplyTag, r.comm, &r.sends.back().second);
  }
}

void wait_watched(MPI_Request* reqs, int n, const Watch& w) {
  RollCall& r = rc();
  // Nested waits (none today) keep the outer operation's description.
  const bool outer = !r.waiting;
  if (outer) {
    r.waiting = true;
    r.op = w.op;
    r.group = w.group;
    r.seq = w.seq;
    r.since = Clock::now();
  }
  struct Reset {
    bool on;
    ~Reset() {
      if (on) rc().waiting = false;
    }
  } reset{outer};
  const auto start = Clock::now();
  for (long spin = 0;; ++spin) {
    int done = 0;
    check_mpi(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE),
              (std::string("MPI (") + w.op + " on group '" + w.group + "')").c_str());
    if (done) return;
    if (spin < 256) continue;
    answer_roll_calls();
    const double el = seconds_since(start);
    if (w.timeout_s > 0 && el > w.timeout_s) {
      const double grace = std::min(5.0, std::max(0.5, w.timeout_s / 4));
      const std::string who = roll_call(w, grace);
      abort_all(timeout_message(w.op, w.group, w.count, w.timeout_s) + ": " + who + "; aborting all ranks", 3);
    }
    // MPI progresses only inside MPI_Testall: keep polling (yielding the core to ranks that
    // share it, as Open MPI's blocking calls do when oversubscribed), unless the wait is a
    // long, expected one.
    if (w.relaxed) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    else std::this_thread::yield();
  }
}

void fault_point(const char* op, const std::string& group) {
  Fault& f = fault();
  if (!f.on || f.rank != world_rank()) return;
  if (f.op != "*" && f.op != op) return;
  if (f.group != "*" && f.group != group) return;
  if (++f.seen != f.nth) return;
  std::fprintf(stderr, "[%s] EASYCTX_FAULT: %s before %s on group '%s'\n", process_label().c_str(), f.action.c_str(),
               op, group.c_str());
  std::fflush(stderr);
  if (f.action == "stall")
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1000));
  if (f.action == "exit") std::_Exit(0);
  if (f.action == "kill") std::raise(SIGKILL);
  EASYCTX_THROW("EASYCTX_FAULT: injected failure before ", op, " on group '", group, "'");
}

WatchdogGuard::WatchdogGuard(const char* op, const std::string& group, size_t count, double timeout_s)
    : slot_(Watchdog::instance().enter(op, group, count, timeout_s)) {}
WatchdogGuard::~WatchdogGuard() { Watchdog::instance().leave(slot_); }

void watch_fence(const void* queue, Fence f, const std::string& op, const std::string& group, size_t count,
                 double timeout_s) {
  Watchdog::instance().watch(queue, std::move(f), op, group, count, timeout_s);
}

}  // namespace easyctx::dist
