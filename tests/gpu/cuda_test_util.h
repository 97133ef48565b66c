// Helpers for the CUDA-vs-CPU tests: a fixture that skips without a GPU and holds both
// backends, host<->device transfers of fp32 vectors in any storage dtype, bf16 rounding of
// host data (so the reference sees exactly the GPU's inputs), NaN poisoning of outputs.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "ops/cuda/cuda_backend.h"
#include "ops/half.h"
#include "ops/ops.h"
#include "test_util.h"

namespace easyctx::test {

using ops::Buffer;
using ops::DType;
using ops::MemSpace;
using ops::Tensor;

inline bool have_gpu() { return ops::cuda_device_count() > 0; }

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (ops::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: the CUDA backend tests need a GPU";
    gpu = ops::make_cuda_backend();
    cpu = ops::make_cpu_backend();
    rng.seed(test_seed());
  }

  // Host fp32 data rounded to what `t` can hold (bf16 rounding for BF16).
  static std::vector<float> rounded(std::vector<float> v, DType t) {
    if (t == DType::BF16)
      for (auto& x : v) x = ops::bf16_to_float(ops::float_to_bf16(x));
    return v;
  }
  std::vector<float> rand(size_t n, DType t, double lo = -1, double hi = 1) {
    return rounded(random_vector<float>(n, rng, lo, hi), t);
  }

  // Device buffer of dtype t holding v (converted); shape given by the caller's views.
  Buffer upload(const std::vector<float>& v, DType t) {
    Buffer b = gpu->alloc(t, static_cast<int64_t>(v.size()));
    Tensor src(const_cast<float*>(v.data()), DType::F32, {static_cast<int64_t>(v.size())});
    gpu->copy(b.flat(), src);
    return b;
  }
  Buffer upload_i32(const std::vector<int32_t>& v) {
    Buffer b = gpu->alloc(DType::I32, static_cast<int64_t>(v.size()));
    Tensor src(const_cast<int32_t*>(v.data()), DType::I32, {static_cast<int64_t>(v.size())});
    gpu->copy(b.flat(), src);
    return b;
  }
  std::vector<float> download(const Buffer& b) {
    std::vector<float> v(static_cast<size_t>(b.numel()));
    Tensor dst(v.data(), DType::F32, {b.numel()});
    gpu->copy(dst, b.flat());
    return v;
  }
  // v behind `off` leading elements (0.5), so every view of it is misaligned by off elements.
  struct Padded {
    Buffer buf;
    int64_t off;
    Tensor view(std::initializer_list<int64_t> dims) const { return buf.flat().slice_flat(off, dims); }
  };
  Padded upload_padded(const std::vector<float>& v, DType t, int64_t off) {
    std::vector<float> p(static_cast<size_t>(off), 0.5f);
    p.insert(p.end(), v.begin(), v.end());
    return Padded{upload(p, t), off};
  }
  std::vector<float> download(const Padded& b) {
    auto v = download(b.buf);
    v.erase(v.begin(), v.begin() + b.off);
    return v;
  }
  std::vector<uint16_t> download_bits(const Buffer& b) {  // raw 16-bit words (bf16)
    std::vector<uint16_t> v(static_cast<size_t>(b.numel()));
    Tensor dst(v.data(), b.dtype(), {b.numel()});
    gpu->copy(dst, b.flat());
    return v;
  }
  void poison(const Buffer& b) { gpu->fill(b.flat(), std::numeric_limits<double>::quiet_NaN()); }

  static Tensor host(std::vector<float>& v, std::initializer_list<int64_t> dims) {
    return Tensor(v.data(), DType::F32, dims);
  }
  static Tensor host_i32(std::vector<int32_t>& v, std::initializer_list<int64_t> dims) {
    return Tensor(v.data(), DType::I32, dims);
  }
  static double tol(DType t) { return t == DType::BF16 ? 1e-2 : 1e-5; }

  std::unique_ptr<ops::Backend> gpu, cpu;
  std::mt19937_64 rng;
  std::string tag;  // printed with each accuracy line (dtype, case)
};

// EXPECT_LT(rel_error(got, ref), tol) that also prints the measured error, so a GPU run's
// log records the accuracy of every op.
#define EXPECT_REL(got, ref, tol_)                                                                      \
  do {                                                                                                  \
    const double e_ = ::easyctx::test::rel_error(got, ref);                                             \
    std::printf("[accuracy] %-28s %-34s %-22s rel err %.3g (tol %.0e)\n",                               \
                ::testing::UnitTest::GetInstance()->current_test_info()->name(), tag.c_str(), #got, e_, \
                static_cast<double>(tol_));                                                             \
    EXPECT_LT(e_, tol_);                                                                                \
  } while (0)

// a - a0 element by element: what an accumulating op added onto its start a0.
inline std::vector<float> increment(const std::vector<float>& a, const std::vector<float>& a0) {
  std::vector<float> r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = a[i] - a0[i];
  return r;
}

// An accumulating gradient against the reference's from the same start: the sum within 1e-2,
// and the increments alone within 3e-2 (stricter when the increment is small next to the start).
#define EXPECT_ACCUMULATED(got, ref, start)                         \
  do {                                                              \
    EXPECT_REL(got, ref, 1e-2);                                     \
    EXPECT_REL(increment(got, start), increment(ref, start), 3e-2); \
  } while (0)

// Strided device layouts for the kernels' odd-stride cases: `batches` batches of `rows` rows
// of `width` elements, rows `row` elements apart and batches `batch` apart, the gaps NaN (a
// kernel that reads them shows it in its output). spread_rows lays packed x out so; gather_rows
// packs it back and counts the gap elements that are no longer NaN (written by the kernel).
inline std::vector<float> spread_rows(const std::vector<float>& x, int64_t batches, int64_t rows, int64_t width,
                                      int64_t row, int64_t batch) {
  std::vector<float> d(static_cast<size_t>(batches * batch), std::numeric_limits<float>::quiet_NaN());
  for (int64_t b = 0; b < batches; ++b)
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(x.begin() + (b * rows + r) * width, width, d.begin() + b * batch + r * row);
  return d;
}
inline std::vector<float> gather_rows(const std::vector<float>& d, int64_t batches, int64_t rows, int64_t width,
                                      int64_t row, int64_t batch, int64_t* pad_written) {
  std::vector<float> x(static_cast<size_t>(batches * rows * width));
  std::vector<char> inside(d.size(), 0);
  for (int64_t b = 0; b < batches; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < width; ++j) {
        x[(b * rows + r) * width + j] = d[b * batch + r * row + j];
        inside[b * batch + r * row + j] = 1;
      }
  *pad_written = 0;
  for (size_t i = 0; i < d.size(); ++i) *pad_written += !inside[i] && !std::isnan(d[i]);
  return x;
}

// An attention LSE against the reference's: -inf (the row sees no key) exactly where the
// reference has it, elsewhere within `tol` nats (absolute: fp32 sums of bf16 products);
// prints the largest error under `tag`. Returns the number of empty rows.
inline int64_t expect_lse_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& tag,
                                double tol = 2e-3) {
  double err = 0;
  int64_t empty = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) {
      ++empty;
      EXPECT_TRUE(std::isinf(got[i]) && got[i] < 0) << tag << ": row " << i << " sees no key: lse -inf, got " << got[i];
    } else {
      err = std::max(err, static_cast<double>(std::abs(got[i] - want[i])));
    }
  }
  std::printf("[accuracy] lse %s: max abs err %.3g nats, %lld empty rows\n", tag.c_str(), err,
              static_cast<long long>(empty));
  EXPECT_LT(err, tol) << tag;
  return empty;
}

}  // namespace easyctx::test
