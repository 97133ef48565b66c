#include "train/host_adamw.h"

#include <cuda_runtime.h>

#include <omp.h>

#include <chrono>
#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "train/adamw_span.h"
#include "core/error.h"
#include "cuda_check.h"

namespace easyctx::train {
namespace {

constexpr int64_t kSpan = 16384;  // elements per OpenMP work item of the update (64 KiB of f32)

}  // namespace

void f32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  const int64_t blocks = (n + kSpan - 1) / kSpan;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t b = 0; b < blocks; ++b) f32_to_bf16_span(src + b * kSpan, dst + b * kSpan, std::min(kSpan, n - b * kSpan));
}

struct HostAdamW::Impl {
  int64_t chunk = 0;
  float* grad[2] = {nullptr, nullptr};     // pinned f32[chunk]
  uint16_t* work[2] = {nullptr, nullptr};  // pinned bf16[chunk]
  cudaStream_t down = nullptr, up = nullptr;
  cudaEvent_t got[2] = {nullptr, nullptr}, sent[2] = {nullptr, nullptr};
  // The running step (start .. finish): its thread, and per unit whether its upload is queued
  // and the event that marks it.
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  enum UnitState : char { kWaiting, kQueued, kEmpty };  // kQueued: its update and upload are queued
  std::vector<char> unit_state;                        // per unit
  std::vector<cudaEvent_t> unit_ev;
  std::exception_ptr error;
  bool failed = false;  // (error reported once; waiters released)
  void run(const std::vector<OffloadPiece>& pieces, const ops::AdamWStep& s, int threads, double* seconds);
  ~Impl() {
    for (cudaEvent_t e : unit_ev)
      if (e) cudaEventDestroy(e);
    for (int s = 0; s < 2; ++s) {
      if (got[s]) cudaEventDestroy(got[s]);
      if (sent[s]) cudaEventDestroy(sent[s]);
      if (grad[s]) cudaFreeHost(grad[s]);
      if (work[s]) cudaFreeHost(work[s]);
    }
    if (down) cudaStreamDestroy(down);
    if (up) cudaStreamDestroy(up);
  }
};

HostAdamW::HostAdamW(int64_t chunk_elems) : impl_(std::make_unique<Impl>()) {
  EASYCTX_CHECK(chunk_elems > 0, "HostAdamW: chunk of ", chunk_elems, " elements");
  Impl& I = *impl_;
  I.chunk = chunk_elems;
  for (int s = 0; s < 2; ++s) {
    EASYCTX_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&I.grad[s]), static_cast<size_t>(chunk_elems) * 4));
    EASYCTX_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&I.work[s]), static_cast<size_t>(chunk_elems) * 2));
    EASYCTX_CUDA_CHECK(cudaEventCreateWithFlags(&I.got[s], cudaEventDisableTiming));
    EASYCTX_CUDA_CHECK(cudaEventCreateWithFlags(&I.sent[s], cudaEventDisableTiming));
  }
  EASYCTX_CUDA_CHECK(cudaStreamCreateWithFlags(&I.down, cudaStreamNonBlocking));
  EASYCTX_CUDA_CHECK(cudaStreamCreateWithFlags(&I.up, cudaStreamNonBlocking));
}

HostAdamW::~HostAdamW() {
  try {
    finish();
  } catch (...) {  // a destructor cannot throw; the error was the caller's to collect
  }
}

int64_t HostAdamW::pinned_bytes() const { return 2 * impl_->chunk * 6; }

void HostAdamW::step(const std::vector<OffloadPiece>& pieces, const ops::AdamWStep& s) {
  start(pieces, s, omp_get_max_threads());
  finish();
}

void HostAdamW::start(std::vector<OffloadPiece> pieces, const ops::AdamWStep& s, int threads) {
  finish();
  Impl& I = *impl_;
  size_t units = 0;
  for (const OffloadPiece& p : pieces) units = std::max(units, p.unit + 1);
  for (size_t u = I.unit_ev.size(); u < units; ++u) {
    I.unit_ev.push_back(nullptr);
    EASYCTX_CUDA_CHECK(cudaEventCreateWithFlags(&I.unit_ev.back(), cudaEventDisableTiming));
  }
  I.unit_state.assign(I.unit_ev.size(), Impl::kEmpty);  // (nothing to wait for)
  for (const OffloadPiece& p : pieces)
    if (p.n > 0) I.unit_state[p.unit] = Impl::kWaiting;
  I.error = nullptr;
  I.failed = false;
  int device = 0;
  EASYCTX_CUDA_CHECK(cudaGetDevice(&device));
  I.worker = std::thread([this, device, threads, pieces = std::move(pieces), s] {
    Impl& W = *impl_;
    try {
      EASYCTX_CUDA_CHECK(cudaSetDevice(device));  // the current device is per host thread
      W.run(pieces, s, std::max(1, threads), &last_seconds_);
    } catch (...) {
      std::lock_guard<std::mutex> lk(W.mu);
      W.error = std::current_exception();
      W.failed = true;
      W.cv.notify_all();
    }
  });
}

cudaEvent_t HostAdamW::wait_unit(size_t u) {
  Impl& I = *impl_;
  if (!I.worker.joinable()) return nullptr;  // no step running (or it was finished)
  std::unique_lock<std::mutex> lk(I.mu);
  I.cv.wait(lk, [&] { return I.failed || u >= I.unit_state.size() || I.unit_state[u] != Impl::kWaiting; });
  if (I.failed) {
    lk.unlock();
    finish();  // joins and rethrows
  }
  if (u >= I.unit_state.size() || I.unit_state[u] == Impl::kEmpty) return nullptr;
  return I.unit_ev[u];
}

bool HostAdamW::pending() const { return impl_->worker.joinable(); }

void HostAdamW::finish() {
  Impl& I = *impl_;
  if (!I.worker.joinable()) return;
  I.worker.join();
  if (I.error) {
    std::exception_ptr e = I.error;
    I.error = nullptr;
    std::rethrow_exception(e);
  }
  EASYCTX_CUDA_CHECK(cudaStreamSynchronize(I.up));
  EASYCTX_CUDA_CHECK(cudaStreamSynchronize(I.down));
}

void HostAdamW::Impl::run(const std::vector<OffloadPiece>& pieces, const ops::AdamWStep& s, int threads,
                          double* seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  Impl& I = *this;
  struct Chunk {
    const OffloadPiece* p;
    int64_t off, n;
  };
  std::vector<Chunk> chunks;
  for (const OffloadPiece& p : pieces)
    for (int64_t off = 0; off < p.n; off += I.chunk) chunks.push_back({&p, off, std::min(I.chunk, p.n - off)});
  auto fetch = [&](size_t i) {  // gradient chunk i -> slot i % 2
    const Chunk& c = chunks[i];
    const int sl = static_cast<int>(i % 2);
    EASYCTX_CUDA_CHECK(cudaMemcpyAsync(I.grad[sl], c.p->grad_dev + c.off, static_cast<size_t>(c.n) * 4,
                                     cudaMemcpyDeviceToHost, I.down));
    EASYCTX_CUDA_CHECK(cudaEventRecord(I.got[sl], I.down));
  };
  bool sent_pending[2] = {false, false};
  if (!chunks.empty()) fetch(0);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    const int sl = static_cast<int>(i % 2);
    EASYCTX_CUDA_CHECK(cudaEventSynchronize(I.got[sl]));
    if (i + 1 < chunks.size()) fetch(i + 1);  // the other slot's gradient buffer was consumed at i - 1
    const kernels::AdamWConsts k = kernels::adamw_consts(s.lr, s.beta1, s.beta2, s.eps, c.p->weight_decay, s.step);
    float *p = c.p->master + c.off, *m = c.p->m + c.off, *v = c.p->v + c.off;
    const float* g = I.grad[sl];
    const bool in_place = c.p->work_host != nullptr;  // host bf16 weights: written here, nothing to upload
    uint16_t* out = in_place ? c.p->work_host + c.off : I.work[sl];
    if (!in_place && sent_pending[sl])
      EASYCTX_CUDA_CHECK(cudaEventSynchronize(I.sent[sl]));  // chunk i - 2 left this slot
    // One pass: the update and the bf16 copy of the new weight (one read of the master less),
    // in contiguous 64-byte-aligned blocks per thread.
    const int64_t blocks = (c.n + kSpan - 1) / kSpan;
#pragma omp parallel for schedule(static) num_threads(threads) if (c.n > (1 << 16))
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t j = b * kSpan;
      adamw_bf16_span(p + j, g + j, m + j, v + j, out + j, std::min(kSpan, c.n - j), k);
    }
    if (!in_place) {
      EASYCTX_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint16_t*>(c.p->work_dev) + c.off, I.work[sl],
                                       static_cast<size_t>(c.n) * 2, cudaMemcpyHostToDevice, I.up));
      EASYCTX_CUDA_CHECK(cudaEventRecord(I.sent[sl], I.up));
      sent_pending[sl] = true;
    }
    const size_t u = c.p->unit;
    if (i + 1 == chunks.size() || chunks[i + 1].p->unit != u) {  // the unit's last chunk: its uploads are queued
      EASYCTX_CUDA_CHECK(cudaEventRecord(I.unit_ev[u], I.up));
      std::lock_guard<std::mutex> lk(I.mu);
      I.unit_state[u] = kQueued;
      I.cv.notify_all();
    }
  }
  EASYCTX_CUDA_CHECK(cudaStreamSynchronize(I.up));
  EASYCTX_CUDA_CHECK(cudaStreamSynchronize(I.down));
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace easyctx::train
