// The host's memory bandwidth beside the host AdamW's (parallel.zero.offload_optimizer):
// STREAM-like copy and triad over OpenMP threads, then the update the host optimizer runs
// (zero::adamw_bf16_span: fp32 master weight, gradient, m and v in, weight, m, v and the bf16
// copy out; 30 bytes an element) over the same threads, each as GB/s (bytes read plus bytes
// written over the median time of --repeats). Arrays are 2 MiB aligned with transparent huge
// pages asked for and first touched by the thread that uses them, as the CPU backend
// allocates the optimizer's state; the update is also timed on one thread fewer (the deferred
// update's count: one core is left to the kernel launches) and on 4 KiB pages. The first touch
// itself is timed too (GB/s of zeroed pages: the start-up's cost per byte of host state), on
// every thread with huge pages and on one thread with 4 KiB pages (the allocator before).
//   build/bin/bench_host_stream [--gib-per-array 2] [--repeats 5] [--threads N]
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/adamw_math.h"
#include "zero/adamw_span.h"

namespace {

constexpr int64_t kSpan = 16384;  // elements per work item, as the host optimizer's

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <class T>
using HostArray = std::unique_ptr<T[], FreeDeleter>;

constexpr size_t kHuge = size_t{2} << 20;

// n elements, 2 MiB aligned, huge pages asked for (or refused), not touched yet.
template <class T>
HostArray<T> host_array(int64_t n, bool huge) {
  const size_t bytes = (static_cast<size_t>(n) * sizeof(T) + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, bytes);
  if (!p) throw std::bad_alloc();
  madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  return HostArray<T>(static_cast<T*>(p));
}

template <class F>
double median_seconds(int repeats, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <class F>
void each_span(int64_t n, F&& f) {
  const int64_t spans = (n + kSpan - 1) / kSpan;
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < spans; ++s) f(s * kSpan, std::min(kSpan, n - s * kSpan));
}

}  // namespace

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  double gib = 2;
  int repeats = 5, threads = 0;
  po::options_description opts("bench_host_stream");
  opts.add_options()("help", "this text")("gib-per-array", po::value(&gib), "GiB of each fp32 array (default 2)")(
      "repeats", po::value(&repeats), "timed repeats, median reported (default 5)")("threads", po::value(&threads),
                                                                                    "OpenMP threads (default: all)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, opts), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::printf("%s\n", "bench_host_stream [--gib-per-array G] [--repeats R] [--threads N]");
    return 0;
  }
  if (threads > 0) omp_set_num_threads(threads);
  const int all = omp_get_max_threads();
  const int64_t n = static_cast<int64_t>(gib * (1LL << 30)) / 4;
  const double bytes4 = 4.0 * static_cast<double>(n);
  const auto seconds = [](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // First touch: every thread over huge pages (the CPU backend now), one thread over 4 KiB pages.
  auto a = host_array<float>(n, true), b = host_array<float>(n, true), c = host_array<float>(n, true);
  auto d = host_array<float>(n, true);
  auto w = host_array<uint16_t>(n, true);
  const double touch_huge =
      seconds([&] { each_span(n, [&](int64_t o, int64_t k) { std::memset(a.get() + o, 0, 4 * k); }); });
  auto a4 = host_array<float>(n, false);
  const double touch_4k = seconds([&] { std::memset(a4.get(), 0, 4 * static_cast<size_t>(n)); });
  each_span(n, [&](int64_t o, int64_t k) {  // first touch by the using thread, random-ish values
    for (int64_t i = o; i < o + k; ++i) {
      a[i] = 1e-3f * static_cast<float>((i * 2654435761u) % 1000) - 0.5f;
      b[i] = 1e-4f * static_cast<float>((i * 40503u) % 1000);
      c[i] = 1e-6f * static_cast<float>((i * 69069u) % 1000);
      d[i] = 1e-8f * static_cast<float>((i * 1103515245u) % 1000);
      w[i] = 0;
    }
  });
  const double copy = median_seconds(repeats, [&] {
    each_span(n, [&](int64_t o, int64_t k) { std::copy(a.get() + o, a.get() + o + k, c.get() + o); });
  });
  const double triad = median_seconds(repeats, [&] {
    each_span(n, [&](int64_t o, int64_t k) {
      for (int64_t i = o; i < o + k; ++i) c[i] = a[i] + 0.5f * b[i];
    });
  });
  const easyctx::kernels::AdamWConsts k = easyctx::kernels::adamw_consts(1e-5, 0.9, 0.95, 1e-8, 0.1, 7);
  const auto adamw_on = [&](float* p, float* g, float* m, float* v, uint16_t* out) {
    return median_seconds(repeats, [&] {
      each_span(
          n, [&](int64_t o, int64_t r) { easyctx::zero::adamw_bf16_span(p + o, g + o, m + o, v + o, out + o, r, k); });
    });
  };
  const double adamw = adamw_on(a.get(), b.get(), c.get(), d.get(), w.get());
  omp_set_num_threads(std::max(1, all - 1));
  const double adamw_less = adamw_on(a.get(), b.get(), c.get(), d.get(), w.get());
  omp_set_num_threads(all);
  a.reset();  // the 4 KiB-page update: its own arrays
  auto b4 = host_array<float>(n, false), c4 = host_array<float>(n, false), d4 = host_array<float>(n, false);
  auto w4 = host_array<uint16_t>(n, false);
  each_span(n, [&](int64_t o, int64_t r) {
    for (int64_t i = o; i < o + r; ++i) a4[i] = b4[i] = c4[i] = d4[i] = 1e-3f * static_cast<float>(i % 1000), w4[i] = 0;
  });
  const double adamw_4k = adamw_on(a4.get(), b4.get(), c4.get(), d4.get(), w4.get());
  std::printf("threads %d, %lld fp32 elements per array (%.2f GiB)\n", all, static_cast<long long>(n),
              bytes4 / (1 << 30));
  std::printf("%-36s %8s %10s\n", "kernel", "s", "GB/s");
  std::printf("%-36s %8.4f %10.1f\n", "copy (8 B/elem)", copy, 2 * bytes4 / copy / 1e9);
  std::printf("%-36s %8.4f %10.1f\n", "triad (12 B/elem)", triad, 3 * bytes4 / triad / 1e9);
  std::printf("%-36s %8.4f %10.1f\n", "host adamw (30 B/elem)", adamw, 7.5 * bytes4 / adamw / 1e9);
  std::printf("%-36s %8.4f %10.1f\n", "host adamw, one thread fewer", adamw_less, 7.5 * bytes4 / adamw_less / 1e9);
  std::printf("%-36s %8.4f %10.1f\n", "host adamw, 4 KiB pages", adamw_4k, 7.5 * bytes4 / adamw_4k / 1e9);
  std::printf("%-36s %8.4f %10.1f\n", "first touch, all threads, huge pages", touch_huge, bytes4 / touch_huge / 1e9);
  std::printf("%-36s %8.4f %10.1f\n", "first touch, one thread, 4 KiB pages", touch_4k, bytes4 / touch_4k / 1e9);
  std::printf("adamw / triad bandwidth: %.2f\n", (7.5 * bytes4 / adamw) / (3 * bytes4 / triad));
  return 0;
}
