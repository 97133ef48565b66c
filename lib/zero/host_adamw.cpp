#include "zero/host_adamw.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "zero/adamw_span.h"

namespace easyctx::zero {
namespace {

constexpr int64_t kSpan = 16384;  // elements per OpenMP work item of the update (64 KiB of f32)

}  // namespace

void f32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  const int64_t blocks = (n + kSpan - 1) / kSpan;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t b = 0; b < blocks; ++b)
    f32_to_bf16_span(src + b * kSpan, dst + b * kSpan, std::min(kSpan, n - b * kSpan));
}

struct HostAdamW::Impl {
  ops::Backend& be;
  int64_t chunk = 0;
  ops::Buffer grad[2], work[2];  // pinned f32[chunk], bf16[chunk]
  std::unique_ptr<Queue> down, up;
  // The running step (start .. finish): its thread, and per unit whether its upload is issued
  // and the fence that marks it.
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  enum UnitState : char { kWaiting, kQueued, kEmpty };  // kQueued: its update and upload are issued
  std::vector<char> unit_state;                         // per unit
  std::vector<Fence> unit_fence;
  std::exception_ptr error;
  bool failed = false;  // (error reported once; waiters released)
  explicit Impl(ops::Backend& b) : be(b) {}
  void run(const std::vector<OffloadPiece>& pieces, const ops::AdamWStep& s, int threads, double* seconds);
};

HostAdamW::HostAdamW(ops::Backend& be, int64_t chunk_elems) : impl_(std::make_unique<Impl>(be)) {
  EASYCTX_CHECK(chunk_elems > 0, "HostAdamW: chunk of ", chunk_elems, " elements");
  Impl& I = *impl_;
  I.chunk = chunk_elems;
  for (int s = 0; s < 2; ++s) {
    I.grad[s] = be.alloc_host_pinned(DType::F32, chunk_elems, "optimizer offload staging (pinned)");
    I.work[s] = be.alloc_host_pinned(DType::BF16, chunk_elems, "optimizer offload staging (pinned)");
  }
  I.down = be.make_queue();
  I.up = be.make_queue();
}

HostAdamW::~HostAdamW() {
  try {
    finish();
  } catch (...) {  // a destructor cannot throw; the error was the caller's to collect
  }
}

int64_t HostAdamW::pinned_bytes() const { return 2 * impl_->chunk * 6; }

void HostAdamW::step(const std::vector<OffloadPiece>& pieces, const ops::AdamWStep& s) {
  // A synchronous step is exposed whole: its wait is the call's time (which holds the worker's
  // run), not the join alone (on a busy host the worker may be done before the join starts).
  const double waited_before = times_.waited;
  const auto t0 = std::chrono::steady_clock::now();
  start(pieces, s, omp_get_max_threads());
  finish();
  times_.waited = waited_before + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

HostAdamWTimes HostAdamW::take_times() {
  const HostAdamWTimes t = times_;
  times_ = HostAdamWTimes();
  return t;
}

void HostAdamW::start(std::vector<OffloadPiece> pieces, const ops::AdamWStep& s, int threads) {
  finish();
  Impl& I = *impl_;
  size_t units = 0;
  last_elements_ = 0;
  for (const OffloadPiece& p : pieces) {
    units = std::max(units, p.unit + 1);
    last_elements_ += p.n;
  }
  I.unit_state.assign(std::max(units, I.unit_state.size()), Impl::kEmpty);  // (nothing to wait for)
  I.unit_fence.assign(I.unit_state.size(), Fence());
  for (const OffloadPiece& p : pieces)
    if (p.n > 0) I.unit_state[p.unit] = Impl::kWaiting;
  I.error = nullptr;
  I.failed = false;
  I.worker = std::thread([this, threads, pieces = std::move(pieces), s] {
    Impl& W = *impl_;
    try {
      W.be.bind_thread();  // (CUDA: the current device is per host thread)
      W.run(pieces, s, std::max(1, threads), &last_seconds_);
    } catch (...) {
      std::lock_guard<std::mutex> lk(W.mu);
      W.error = std::current_exception();
      W.failed = true;
      W.cv.notify_all();
    }
  });
}

Fence HostAdamW::wait_unit(size_t u) {
  Impl& I = *impl_;
  if (!I.worker.joinable()) return {};  // no step running (or it was finished)
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(I.mu);
  I.cv.wait(lk, [&] { return I.failed || u >= I.unit_state.size() || I.unit_state[u] != Impl::kWaiting; });
  times_.waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (I.failed) {
    lk.unlock();
    finish();  // joins and rethrows
  }
  if (u >= I.unit_state.size() || I.unit_state[u] == Impl::kEmpty) return {};
  return I.unit_fence[u];
}

bool HostAdamW::pending() const { return impl_->worker.joinable(); }

void HostAdamW::finish() {
  Impl& I = *impl_;
  if (!I.worker.joinable()) return;
  const auto t0 = std::chrono::steady_clock::now();
  I.worker.join();
  times_.waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (I.error) {
    std::exception_ptr e = I.error;
    I.error = nullptr;
    std::rethrow_exception(e);
  }
  I.up->synchronize();
  I.down->synchronize();
  ++times_.steps;
  times_.elements += last_elements_;
  times_.seconds += last_seconds_;
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
  const MemSpace dev = be.memspace();
  Fence got[2], sent[2];
  auto fetch = [&](size_t i) {  // gradient chunk i -> slot i % 2 (one in host memory is read in place)
    const Chunk& c = chunks[i];
    if (c.p->grad_host) return;
    const int sl = static_cast<int>(i % 2);
    be.copy_on(*I.down, I.grad[sl].flat().slice_flat(0, {c.n}),
               ops::Tensor(const_cast<float*>(c.p->grad_dev + c.off), DType::F32, {c.n}, dev));
    got[sl] = I.down->record();
  };
  if (!chunks.empty()) fetch(0);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    const int sl = static_cast<int>(i % 2);
    got[sl].host_wait();
    if (i + 1 < chunks.size()) fetch(i + 1);  // the other slot's gradient buffer was consumed at i - 1
    const kernels::AdamWConsts k = kernels::adamw_consts(s.lr, s.beta1, s.beta2, s.eps, c.p->weight_decay, s.step);
    float *p = c.p->master + c.off, *m = c.p->m + c.off, *v = c.p->v + c.off;
    const float* g = c.p->grad_host ? c.p->grad_host + c.off : I.grad[sl].flat().ptr<float>();
    const bool in_place = c.p->work_host != nullptr;  // host bf16 weights: written here, nothing to upload
    uint16_t* out = in_place ? c.p->work_host + c.off : static_cast<uint16_t*>(I.work[sl].data());
    if (!in_place) sent[sl].host_wait();  // chunk i - 2 left this slot
    // One pass: the update and the bf16 copy of the new weight (one read of the master less),
    // in contiguous 64-byte-aligned blocks per thread.
    const int64_t blocks = (c.n + kSpan - 1) / kSpan;
#pragma omp parallel for schedule(static) num_threads(threads) if (c.n > (1 << 16))
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t j = b * kSpan;
      adamw_bf16_span(p + j, g + j, m + j, v + j, out + j, std::min(kSpan, c.n - j), k);
    }
    if (!in_place) {
      be.copy_on(*I.up, ops::Tensor(static_cast<uint16_t*>(c.p->work_dev) + c.off, DType::BF16, {c.n}, dev),
                 I.work[sl].flat().slice_flat(0, {c.n}));
      sent[sl] = I.up->record();
    }
    const size_t u = c.p->unit;
    if (i + 1 == chunks.size() || chunks[i + 1].p->unit != u) {  // the unit's last chunk: its uploads are issued
      Fence f = I.up->record();
      std::lock_guard<std::mutex> lk(I.mu);
      I.unit_fence[u] = std::move(f);
      I.unit_state[u] = kQueued;
      I.cv.notify_all();
    }
  }
  I.up->synchronize();
  I.down->synchronize();
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace easyctx::zero
