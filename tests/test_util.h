// Helpers shared by the test suites: fresh random inputs (seeded from the test name and the
// clock, printed so a failure can be replayed), error norms, fixture paths, skips.
#pragma once
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/json.h"

namespace easyctx::test {

// The message of the InputError that f throws, "" when it throws none (any other exception
// propagates and fails the test): for checks that bad input names its file, key or value.
inline std::string input_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) { return e.what(); }
  return "";
}

// Seed: EASYCTX_TEST_SEED if set, else fresh per run; printed once per test so a failing
// draw can be reproduced.
inline uint64_t test_seed() {
  if (const char* s = std::getenv("EASYCTX_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  static uint64_t base = static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  uint64_t h = base;
  if (info)
    for (const char* p = info->name(); *p; ++p) h = h * 1099511628211ull + static_cast<unsigned char>(*p);
  return h;
}

template <typename T = float>
std::vector<T> random_vector(size_t n, std::mt19937_64& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(d(rng));
  return v;
}

// ||a - b|| / ||b|| in double.
template <typename A, typename B>
double rel_error(const A& a, const B& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += d * d;
    den += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return std::sqrt(num) / (std::sqrt(den) + 1e-300);
}

inline std::string source_dir() {
  const char* s = std::getenv("EASYCTX_SOURCE_DIR");
  return s ? s : EASYCTX_SOURCE_DIR;
}
inline std::string bin_dir() {
  const char* s = std::getenv("EASYCTX_BIN_DIR");
  return s ? s : "build/bin";
}
// Runs `cmd` through the shell with stderr joined to stdout into `out`; its exit status, or -1
// when it did not exit normally.
inline int run_shell(const std::string& cmd, std::string& out) {
  out.clear();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
// A metrics.jsonl record without its wall-clock fields (what two runs of the same steps
// differ in), as JSON text.
inline std::string without_wall_clock(const Json& record) {
  Json k = Json::object();
  for (const auto& [key, v] : record.as_object())
    if (key != "tokens_per_s" && key != "fwd_bwd_s" && key != "elapsed" && key != "host_peak_gib") k.set(key, v);
  return k.dump();
}

// ../shared/fixtures/... relative to the source tree.
inline std::string shared_fixture(const std::string& rel) { return source_dir() + "/../shared/fixtures/" + rel; }

}  // namespace easyctx::test
