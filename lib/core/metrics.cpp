#include "core/metrics.h"

#include <fcntl.h>
#include <unistd.h>

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
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  EASYCTX_CHECK(fd_ >= 0, path, ": cannot open metrics file: ", std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::write(const Json& record) {
  if (fd_ < 0) return;
  std::string line = record.dump();
  line.push_back('\n');
  // No partial line for the next reader: append_whole cuts the file back on failure.
  if (const int e = append_whole(fd_, line))
    EASYCTX_THROW(path_, ": cannot write the metrics record of step ",
                  record.find("step") ? record.at("step").dump() : std::string("?"), ": ", std::strerror(e),
                  " (the run stops rather than lose records; free space and resume)");
}

}  // namespace easyctx
