#include "core/log.h"

#include <cstdio>
#include <mutex>

namespace easyctx {
namespace {
struct LogState {
  LogOptions opts;
  FILE* file = nullptr;
  std::mutex mu;
};
LogState& state() {
  static LogState s;
  return s;
}
}  // namespace

void log_init(const LogOptions& opts) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.opts = opts;
  if (s.file) std::fclose(s.file);
  s.file = nullptr;
  if (!opts.per_rank_file.empty()) {
    s.file = std::fopen(opts.per_rank_file.c_str(), "a");
    EASYCTX_CHECK(s.file != nullptr, "cannot open per-rank log ", opts.per_rank_file);
  }
}

void log_close() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.file) std::fclose(s.file);
  s.file = nullptr;
}

bool log_enabled(LogLevel level) {
  auto& s = state();
  if (level < s.opts.level) return false;
  // Info/debug lines print on rank 0 only, unless a per-rank file collects them.
  return level >= LogLevel::Warn || s.opts.rank == 0 || s.file != nullptr;
}

void log_write(LogLevel level, const std::string& msg) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const char* tag = level == LogLevel::Warn ? "warning: " : level == LogLevel::Error ? "error: " : "";
  if (level >= LogLevel::Warn) {
    const std::string& who = process_label();
    std::fprintf(stderr, "%s%s%s%s\n", who.empty() ? "" : "[", who.c_str(), who.empty() ? "" : "] ",
                 (tag + msg).c_str());
    std::fflush(stderr);
  } else if (s.opts.rank == 0 && level >= s.opts.level) {
    std::fprintf(stdout, "%s\n", msg.c_str());
    std::fflush(stdout);
  }
  if (s.file) {
    std::fprintf(s.file, "%s%s\n", tag, msg.c_str());
    std::fflush(s.file);
  }
}

}  // namespace easyctx
