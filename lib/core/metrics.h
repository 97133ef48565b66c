// <output.dir>/metrics.jsonl: one JSON object per line, flushed per record so a killed run
// keeps every finished step. Rank 0 writes.
#pragma once
#include <cstdio>
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
  bool is_open() const { return f_ != nullptr; }
  void write(const Json& record);  // must be an object
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  FILE* f_ = nullptr;
};

}  // namespace easyctx
