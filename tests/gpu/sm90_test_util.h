// Helpers shared by the Hopper attention kernel tests (test_cuda_attention_sm90*.cpp): a
// fixture that skips without an sm_90 device, the error measures that name a faulty layer, and
// the test cases' shape with the AttentionParams it gives.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/attention_sm90.h"

namespace easyctx::test {

class CudaAttentionSm90Test : public CudaOpsTest {
 protected:
  void SetUp() override {
    CudaOpsTest::SetUp();
    if (IsSkipped()) return;
    if (!kernels::sm90_device_available())
      GTEST_SKIP() << "needs an sm_90 device (H100/H200): the kernel is sm_90a code";
  }
  const __nv_bfloat16* bf(const Buffer& b) { return static_cast<const __nv_bfloat16*>(b.data()); }
  __nv_bfloat16* bfm(const Buffer& b) { return static_cast<__nv_bfloat16*>(const_cast<void*>(b.data())); }
};

// Prints up to `n` entries where |got - ref| > atol + rtol |ref|, with their (row, col) in a
// [rows x cols] matrix and where in ref the got value does sit (the closest entry: a wrong
// fragment or swizzle mapping shows up as a consistent permutation of rows / columns);
// returns how many entries are off.
inline int64_t report_mismatches(const char* what, const std::vector<float>& got, const std::vector<float>& ref,
                                 int64_t cols, double atol, double rtol, int n = 8) {
  int64_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::abs(static_cast<double>(got[i]) - ref[i]);
    if (!(d <= atol + rtol * std::abs(ref[i]))) {
      if (bad < n) {
        size_t best = 0;
        double bd = INFINITY;
        for (size_t j = 0; j < ref.size(); ++j) {
          const double e = std::abs(static_cast<double>(got[i]) - ref[j]);
          if (e < bd) bd = e, best = j;
        }
        std::printf(
            "  [mismatch] %s row %lld col %lld: got %.6g want %.6g; got is closest to ref row %lld col %lld "
            "(%.6g, off by %.3g)\n",
            what, static_cast<long long>(i / cols), static_cast<long long>(i % cols), got[i], ref[i],
            static_cast<long long>(best / cols), static_cast<long long>(best % cols), ref[best], bd);
      }
      ++bad;
    }
  }
  if (bad) std::printf("  [mismatch] %s: %lld of %zu entries off\n", what, static_cast<long long>(bad), ref.size());
  return bad;
}

// The largest |a - b| (infinity where either is NaN).
inline double max_abs(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    e = std::isnan(d) ? INFINITY : std::max(e, d);
  }
  return e;
}

// One test shape.
struct Case {
  int64_t b, sq, sk, hq, hkv, hd;
  bool causal;
  int64_t diag;     // key j visible to query i iff j <= i + diag
  int64_t pad = 0;  // extra (NaN) elements after each row and each batch: strided views
};

inline std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << "B" << c.b << " Sq" << c.sq << " Sk" << c.sk << " Hq" << c.hq << " Hkv" << c.hkv << " hd" << c.hd
            << (c.causal ? " causal diag " + std::to_string(c.diag) : std::string(" full"))
            << (c.pad ? " row pad " + std::to_string(c.pad) : std::string());
}

// AttentionParams of case c with these strides and scale, pointers unset.
inline kernels::AttentionParams case_params(const Case& c, double scale, int64_t q_row, int64_t q_batch, int64_t k_row,
                                            int64_t k_batch) {
  kernels::AttentionParams p;
  p.batch = c.b, p.sq = c.sq, p.sk = c.sk;
  p.hq = c.hq, p.hkv = c.hkv, p.hd = c.hd;
  p.q_row = q_row, p.q_batch = q_batch, p.k_row = k_row, p.k_batch = k_batch;
  p.scale = static_cast<float>(scale);
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  p.causal = c.causal, p.diag = c.diag;
  return p;
}

}  // namespace easyctx::test
