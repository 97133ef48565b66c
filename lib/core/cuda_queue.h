// Fences and queues over CUDA streams and events (lib/core/fence.h), shared by the CUDA
// backend (its compute, copy and side streams) and the NCCL communicators. Header-only;
// included only by sources built with CUDA. Events come from a process-wide pool and go back
// to it when the last copy of their Fence is gone, so recording a fence costs no allocation
// once the pool is warm.
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/fence.h"

namespace easyctx::cuda_queue {

inline void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    EASYCTX_THROW(process_label(), " CUDA error ", cudaGetErrorName(rc), " (", cudaGetErrorString(rc), ") in ", what);
}

class EventPool {
 public:
  static EventPool& instance() {
    static EventPool* p = new EventPool;  // never destroyed: fences may outlive static teardown
    return *p;
  }
  cudaEvent_t take() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void give(cudaEvent_t e) {
    std::lock_guard<std::mutex> lk(mu_);
    free_.push_back(e);
  }

 private:
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

class EventFence final : public Fence::Impl {
 public:
  explicit EventFence(cudaStream_t s) : ev_(EventPool::instance().take()) {
    check(cudaEventRecord(ev_, s), "cudaEventRecord");
  }
  ~EventFence() override { EventPool::instance().give(ev_); }
  EventFence(const EventFence&) = delete;
  EventFence& operator=(const EventFence&) = delete;
  bool done() const override {
    const cudaError_t rc = cudaEventQuery(ev_);
    if (rc == cudaErrorNotReady) return false;
    check(rc, "cudaEventQuery");
    return true;
  }
  void host_wait() const override { check(cudaEventSynchronize(ev_), "cudaEventSynchronize"); }
  void* native() const override { return ev_; }

 private:
  cudaEvent_t ev_;
};

// A fence after the work issued to stream s so far.
inline Fence record(cudaStream_t s) { return Fence(std::make_shared<const EventFence>(s)); }

// Stream s runs its later work after f (a device fence: on the device; a host fence is
// complete already).
inline void wait(cudaStream_t s, const Fence& f) {
  if (void* ev = f.native()) check(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(ev), 0), "cudaStreamWaitEvent");
  else f.host_wait();
}

// A stream as a Queue: owned (created here, of the highest priority when asked) or borrowed.
class StreamQueue final : public Queue {
 public:
  explicit StreamQueue(bool high_priority) : own_(true) {
    int lo = 0, hi = 0;
    check(cudaDeviceGetStreamPriorityRange(&lo, &hi), "cudaDeviceGetStreamPriorityRange");
    check(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, high_priority ? hi : lo),
          "cudaStreamCreateWithPriority");
  }
  explicit StreamQueue(cudaStream_t borrowed) : s_(borrowed), own_(false) {}
  ~StreamQueue() override {
    if (!own_) return;
    cudaStreamSynchronize(s_);  // (a destructor: nothing to report to)
    cudaStreamDestroy(s_);
  }
  StreamQueue(const StreamQueue&) = delete;
  StreamQueue& operator=(const StreamQueue&) = delete;
  Fence record() override { return cuda_queue::record(s_); }
  void wait(const Fence& f) override { cuda_queue::wait(s_, f); }
  void synchronize() override { check(cudaStreamSynchronize(s_), "cudaStreamSynchronize"); }
  void* native() const override { return s_; }
  cudaStream_t stream() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
  bool own_;
};

}  // namespace easyctx::cuda_queue
