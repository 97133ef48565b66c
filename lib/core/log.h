// Logging: rank 0 prints info to stdout; every rank prints warnings and errors to stderr with
// its host:rank label; `logging.per_rank` also tees every rank's lines to
// <output.dir>/logs/rank<R>.log.
#pragma once
#include <string>

#include "core/error.h"

namespace easyctx {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3 };

struct LogOptions {
  int rank = 0;
  LogLevel level = LogLevel::Info;
  std::string per_rank_file;  // empty: no per-rank file
};
void log_init(const LogOptions& opts);
void log_close();
bool log_enabled(LogLevel level);
void log_write(LogLevel level, const std::string& msg);

template <typename... Args>
void log_info(Args&&... args) {
  if (log_enabled(LogLevel::Info)) log_write(LogLevel::Info, detail::concat(args...));
}
template <typename... Args>
void log_debug(Args&&... args) {
  if (log_enabled(LogLevel::Debug)) log_write(LogLevel::Debug, detail::concat(args...));
}
template <typename... Args>
void log_warn(Args&&... args) {
  if (log_enabled(LogLevel::Warn)) log_write(LogLevel::Warn, detail::concat(args...));
}
template <typename... Args>
void log_error(Args&&... args) {
  log_write(LogLevel::Error, detail::concat(args...));
}

}  // namespace easyctx
