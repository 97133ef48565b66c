#include "core/metrics.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/strings.h"

namespace easyctx {

MetricsWriter::MetricsWriter(const std::string& path, bool append, int64_t first_step) : path_(path) {
  if (append && first_step >= 0) {
    // Keep only records of steps before first_step.
    std::ifstream in(path);
    std::string kept, line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      try {
        Json j = parse_json(line, path);
        const Json* s = j.find("step");
        if (s && s->is_integer() && s->as_int() >= first_step) continue;
      } catch (const Error&) {
        continue;  // a line cut by a kill
      }
      kept += line + "\n";
    }
    write_file_atomic(path, kept);
  }
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  EASYCTX_CHECK(f_ != nullptr, path, ": cannot open metrics file: ", std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const Json& record) {
  if (!f_) return;
  std::string line = record.dump();
  line.push_back('\n');
  EASYCTX_CHECK(std::fwrite(line.data(), 1, line.size(), f_) == line.size(), path_, ": write failed");
  std::fflush(f_);
}

}  // namespace easyctx
