// <output.dir>/metrics.jsonl: one JSON object per line, written per record (one write call)
// so a killed run keeps every finished step. A record that cannot be written whole (a full
// disk, a quota) is an error naming the file and the reason, and the partial line is cut off:
// records are never dropped silently. Rank 0 writes.
#pragma once
#include <string>

#include "core/json.h"

namespace easyctx {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // append=true keeps earlier lines (resume); records for steps >= first_step are dropped
  // first so a resumed run never duplicates a step.
  explicit MetricsWriter(const std::string& path, bool append = false, int64_t first_step = -1);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  bool is_open() const { return fd_ >= 0; }
  void write(const Json& record);  // must be an object
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace easyctx
