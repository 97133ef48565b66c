// Ordering asynchronous work across queues without blocking the host. A Queue is where work
// is issued in order (a backend's compute stream, a communicator's stream, a copy stream); a
// Fence marks a point of one queue, and another queue can wait for it before its later work.
// The compute backend and the communicators record and wait on each other's fences
// (ops::Backend::record/wait, dist::Comm::record/wait), so the trainer, ZeRO-3 and the
// sequence-parallel strategies order a gather, a reduce-scatter or a ring exchange with the
// layers around it on the device, and name no device API.
//
// Host queues (the CPU backend, MPI communicators) finish their work before returning: their
// fences are complete at once, and waiting on another queue's fence blocks the host until it
// is complete (MPI then reads memory the device finished writing).
#pragma once
#include <memory>
#include <utility>

namespace easyctx {

class Fence {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual bool done() const = 0;       // without blocking
    virtual void host_wait() const = 0;  // blocks until done
    virtual void* native() const = 0;    // the device event (cudaEvent_t), or nullptr
  };
  Fence() = default;  // complete
  explicit Fence(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  bool done() const { return !impl_ || impl_->done(); }
  void host_wait() const {
    if (impl_) impl_->host_wait();
  }
  void* native() const { return impl_ ? impl_->native() : nullptr; }

 private:
  std::shared_ptr<const Impl> impl_;
};

class Queue {
 public:
  virtual ~Queue() = default;
  // A fence after everything issued to this queue so far.
  virtual Fence record() = 0;
  // Work issued to this queue from now on runs after `f`.
  virtual void wait(const Fence& f) = 0;
  // Blocks the host until everything issued so far has run.
  virtual void synchronize() = 0;
  // The device stream (cudaStream_t) behind the queue; nullptr for a host queue.
  virtual void* native() const = 0;
};

// The queue of synchronous host work: everything issued has already run.
class HostQueue final : public Queue {
 public:
  Fence record() override { return {}; }
  void wait(const Fence& f) override { f.host_wait(); }
  void synchronize() override {}
  void* native() const override { return nullptr; }
};

}  // namespace easyctx
