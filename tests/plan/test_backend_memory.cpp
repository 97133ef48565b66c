// Allocation tracking of the backends (ops::Backend::memory_stats): live and peak bytes of
// Buffers (and, on CUDA, scratch and the backend's own workspaces), reset_peak_memory.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "ops/ops.h"
#include "test_util.h"
#ifdef EASYCTX_HAVE_CUDA
#include "ops/cuda/cuda_backend.h"
#endif

namespace easyctx {
namespace {

using ops::Buffer;
using ops::DType;

TEST(BackendMemory, CpuCountsLiveAndPeakBytes) {
  auto be = ops::make_cpu_backend();
  EXPECT_EQ(be->memory_stats().live_bytes, 0);
  {
    Buffer a = be->alloc(DType::F32, 1000);  // 4000 bytes
    Buffer b = be->alloc(DType::BF16, 3);    // 6 bytes: counted as asked, not rounded
    EXPECT_EQ(be->memory_stats().live_bytes, 4006);
    a.reset();
    EXPECT_EQ(be->memory_stats().live_bytes, 6);
    Buffer c = be->alloc(DType::F64, 100);  // 800: peak stays at 4006
    EXPECT_EQ(be->memory_stats().live_bytes, 806);
    EXPECT_EQ(be->memory_stats().peak_bytes, 4006);
    Buffer moved = std::move(c);  // a move neither counts nor frees
    EXPECT_EQ(be->memory_stats().live_bytes, 806);
  }
  ops::MemoryStats s = be->memory_stats();
  EXPECT_EQ(s.live_bytes, 0);
  EXPECT_EQ(s.peak_bytes, 4006);
  EXPECT_EQ(s.scratch_peak_bytes, 0);
  Buffer d = be->alloc(DType::I32, 10);
  be->reset_peak_memory();
  EXPECT_EQ(be->memory_stats().peak_bytes, 40);
}

TEST(BackendMemory, CpuBufferMayOutliveItsBackend) {
  Buffer keep;
  {
    auto be = ops::make_cpu_backend();
    keep = be->alloc(DType::F32, 16);
  }
  keep.reset();  // the deleter's counter is shared, not owned by the backend
  SUCCEED();
}

TEST(BackendMemory, CpuCountsAreThreadSafe) {
  auto be = ops::make_cpu_backend();
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) Buffer b = be->alloc(DType::F32, 16);
    });
  for (auto& t : ts) t.join();
  const ops::MemoryStats s = be->memory_stats();
  EXPECT_EQ(s.live_bytes, 0);
  EXPECT_GE(s.peak_bytes, 64);
  EXPECT_LE(s.peak_bytes, 4 * 64);
}

// The offload primitives on the CPU: "pinned" buffers are ordinary counted buffers, copies
// are done when copy_async returns (so the offload path runs, and is measured, on the CPU).
TEST(BackendMemory, CpuPinnedBuffersAreCountedAndCopiesSynchronous) {
  auto be = ops::make_cpu_backend();
  Buffer h = be->alloc_host_pinned(DType::F32, 1000);
  EXPECT_EQ(be->memory_stats().live_bytes, 4000);
  for (int64_t i = 0; i < 1000; ++i) EXPECT_EQ(h.flat().ptr<float>()[i], 0.0f);  // zero-filled
  Buffer d = be->alloc(DType::F32, 1000);
  be->fill(d.flat(), 2.5);
  const ops::CopyFence f = be->copy_async(h.flat(), d.flat());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(h.flat().ptr<float>()[i], 2.5f);
  be->wait_copy(f);
  EXPECT_THROW(be->copy_async(h.flat(), be->alloc(DType::F64, 1000).flat()), Error);  // no conversions
  h.reset();
  EXPECT_EQ(be->memory_stats().live_bytes, 4000);
}

#ifdef EASYCTX_HAVE_CUDA
// Pinned host buffers are host memory: the device counters do not see them.
TEST(BackendMemory, CudaPinnedBuffersAreNotDeviceMemory) {
  if (ops::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = ops::make_cuda_backend();
  const int64_t live = be->memory_stats().live_bytes;
  Buffer h = be->alloc_host_pinned(DType::BF16, 1 << 20);
  EXPECT_EQ(be->memory_stats().live_bytes, live);
  EXPECT_EQ(h.flat().space, ops::MemSpace::Host);
  EXPECT_EQ(h.flat().ptr<uint16_t>()[12345], 0);  // zero-filled
}

// Scratch (the LM-head logits tile) counts towards the peak together with the Buffers.
TEST(BackendMemory, CudaCountsBuffersScratchAndWorkspaces) {
  if (ops::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  ops::CudaBackendOptions o;
  o.cublas_workspace = size_t{1} << 20;
  auto be = ops::make_cuda_backend(o);
  const int64_t own = static_cast<int64_t>(o.cublas_workspace + sizeof(int));
  EXPECT_EQ(be->memory_stats().live_bytes, own);
  const int64_t n = 64, d = 64, vocab = 1000, tile = 16;
  Buffer x = be->alloc(DType::BF16, n * d), w = be->alloc(DType::BF16, vocab * d), dx = be->alloc(DType::BF16, n * d);
  Buffer dw = be->alloc(DType::F32, vocab * d), labels = be->alloc(DType::I32, n);
  const int64_t buffers = 2 * (2 * n * d) + 2 * vocab * d + 4 * vocab * d + 4 * n;
  EXPECT_EQ(be->memory_stats().live_bytes, own + buffers);
  be->reset_peak_memory();
  be->lm_head_loss(x.view({n, d}), w.view({vocab, d}), labels.flat(), tile, 1.0, dx.view({n, d}), dw.view({vocab, d}));
  be->synchronize();
  const ops::MemoryStats s = be->memory_stats();
  EXPECT_EQ(s.live_bytes, own + buffers);  // scratch is gone again
  // logits f32[tile, V] + bf16 gradient tile [tile, V] + f64[n + 2]
  EXPECT_EQ(s.peak_bytes, own + buffers + tile * vocab * 6 + (n + 2) * 8);
  EXPECT_GE(s.scratch_peak_bytes, tile * vocab * 6 + (n + 2) * 8);
  x.reset();
  EXPECT_EQ(be->memory_stats().live_bytes, own + buffers - 2 * n * d);
}
#endif

}  // namespace
}  // namespace easyctx
