// Reading a TensorBoard folder back the way TensorBoard shows it, for the trainer and eval
// tests: every file in name order (tb::read_event_file checks both CRCs of every record), a
// SessionLog START at step s dropping what the earlier files hold at steps >= s (TensorBoard's
// purge of orphaned data), every file starting with its file_version event.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensorboard.h"

namespace easyctx::test {

struct TbScalars {
  std::map<int64_t, std::map<std::string, float>> by_step;  // step -> tag -> value
  std::vector<int64_t> steps_in_order;                      // every scalar event's step, as written
  size_t files = 0;
  int64_t starts = 0;  // SessionLog START events
};

inline double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// `not_before`: a Unix time before the writers started; every wall time lies in
// [not_before, now] and never goes back, within a file or across the files.
inline TbScalars read_tb_folder(const std::string& dir, double not_before) {
  TbScalars out;
  double last = not_before;
  const double now = unix_now();
  for (const std::string& path : tb::list_event_files(dir)) {
    const tb::EventFile f = tb::read_event_file(path);
    ++out.files;
    EXPECT_EQ(f.partial_tail_bytes, 0u) << path;
    if (f.events.empty()) {
      ADD_FAILURE() << path << ": no events";
      continue;
    }
    EXPECT_EQ(f.events[0].file_version, "brain.Event:2") << path;
    for (const tb::Event& e : f.events) {
      EXPECT_GE(e.wall_time, last) << path << " step " << e.step << ": wall time went back";
      EXPECT_LE(e.wall_time, now) << path << " step " << e.step;
      last = e.wall_time;
      if (e.session_status == 1) {
        ++out.starts;
        out.by_step.erase(out.by_step.lower_bound(e.step), out.by_step.end());
      }
      if (e.values.empty()) continue;
      out.steps_in_order.push_back(e.step);
      for (const tb::Scalar& v : e.values) {
        EXPECT_EQ(out.by_step[e.step].count(v.first), 0u) << path << ": " << v.first << " twice at step " << e.step;
        out.by_step[e.step][v.first] = v.second;
      }
    }
  }
  return out;
}

}  // namespace easyctx::test
