// Helpers for op tests: host buffers filled with fresh random values, and a central
// finite-difference checker in fp64.
#pragma once
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "ops/ops.h"
#include "test_util.h"

namespace easyctx::test {

struct OpsFixture : ::testing::Test {
  std::unique_ptr<ops::Backend> be = ops::make_cpu_backend();
  std::mt19937_64 rng{test_seed()};
  void SetUp() override { RecordProperty("seed", std::to_string(test_seed())); }
  void TearDown() override {
    if (HasFailure()) std::printf("replay with EASYCTX_TEST_SEED=%llu\n", static_cast<unsigned long long>(test_seed()));
  }

  ops::Buffer rand(ops::DType t, int64_t n, double lo = -1, double hi = 1) {
    ops::Buffer b = be->alloc(t, n);
    std::uniform_real_distribution<double> d(lo, hi);
    for (int64_t i = 0; i < n; ++i) {
      if (t == ops::DType::F64) b.flat().ptr<double>()[i] = d(rng);
      else b.flat().ptr<float>()[i] = static_cast<float>(d(rng));
    }
    return b;
  }
  ops::Buffer ints(int64_t n, int32_t lo, int32_t hi) {
    ops::Buffer b = be->alloc(ops::DType::I32, n);
    std::uniform_int_distribution<int32_t> d(lo, hi);
    for (int64_t i = 0; i < n; ++i) b.flat().ptr<int32_t>()[i] = d(rng);
    return b;
  }
  int64_t pick(int64_t n) { return std::uniform_int_distribution<int64_t>(0, n - 1)(rng); }
};

// Checks analytic gradient `grad` (f64, n elements) of scalar f w.r.t. `x` (f64, same n) at
// up to `samples` random elements by central differences. Returns max relative error
// |num - ana| / max(|num|, |ana|, floor).
inline double fd_check(double* x, const double* grad, int64_t n, const std::function<double()>& f, std::mt19937_64& rng,
                       int samples = 24, double h = 1e-5, double floor = 1e-3) {
  double worst = 0;
  for (int s = 0; s < samples; ++s) {
    const int64_t i = n <= samples ? s % n : std::uniform_int_distribution<int64_t>(0, n - 1)(rng);
    if (s >= n && n <= samples) break;
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f();
    x[i] = x0 - h;
    const double fm = f();
    x[i] = x0;
    const double num = (fp - fm) / (2 * h);
    const double err = std::abs(num - grad[i]) / std::max({std::abs(num), std::abs(grad[i]), floor});
    worst = std::max(worst, err);
  }
  return worst;
}

inline double dot(const ops::Tensor& a, const ops::Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.ptr<double>()[i] * b.ptr<double>()[i];
  return s;
}

}  // namespace easyctx::test
