// Comm: collectives and point-to-point over one process group. Two implementations:
// MpiComm (CPU backend, host buffers) and NcclComm (CUDA backend, device buffers, enqueued on
// the comm's current stream). Counts are element counts (64-bit), never bytes; the element
// type travels with the call. A collective that does not complete within the configured
// timeout aborts every rank with a message naming the operation and the group.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/dtype.h"
#include "core/fence.h"

namespace easyctx::dist {

constexpr int kNoPeer = -1;

using easyctx::DType;
using easyctx::dtype_name;
using easyctx::dtype_of;
using easyctx::dtype_size;
using easyctx::MemSpace;
enum class ReduceOp { Sum, Max, Min };

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // group name for messages: "world", "dp", "sp", ...
  virtual MemSpace memspace() const = 0;        // where buffers must live
  virtual const char* backend() const = 0;      // "mpi" or "nccl"

  // In-place is allowed where send == recv (all_reduce; all_gather/reduce_scatter with the
  // rank's own slice of recv/send).
  virtual void all_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) = 0;
  // send holds size()*recv_count elements; rank r receives the reduction of block r.
  virtual void reduce_scatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op) = 0;
  // recv holds size()*send_count elements, block r from rank r.
  virtual void all_gather(const void* send, void* recv, size_t send_count, DType t) = 0;
  virtual void broadcast(void* buf, size_t count, DType t, int root) = 0;
  // One paired exchange (ring step): send to dst, receive from src, concurrently. dst or
  // src may be kNoPeer (-1) for a one-sided step at the ends of a chain.
  virtual void send_recv(const void* send, size_t send_count, int dst, void* recv, size_t recv_count, int src,
                         DType t) = 0;
  // send/recv hold size()*count elements; block j of send goes to rank j, block i of recv
  // comes from rank i.
  virtual void all_to_all(const void* send, void* recv, size_t count, DType t) = 0;
  virtual void barrier() = 0;
  // Device backends: wait until every enqueued operation completed (with the timeout).
  virtual void synchronize() {}
  // Ordering with other queues (core/fence.h). A device communicator issues its operations to
  // its own stream, or from now on to `q` (a backend's queue; nullptr: its own again); a host
  // communicator runs them before returning and ignores it.
  virtual void set_queue(Queue* q) { (void)q; }
  // A fence after every operation issued so far (host communicators: complete at once).
  virtual Fence record() { return {}; }
  // Operations issued from now on start after `f` (host communicators: the host waits for it,
  // so MPI reads what the device finished writing).
  virtual void wait(const Fence& f) { f.host_wait(); }

  // Typed helpers.
  template <typename T>
  void all_reduce(T* buf, size_t count, ReduceOp op = ReduceOp::Sum) {
    all_reduce(buf, buf, count, dtype_of<T>(), op);
  }
  template <typename T>
  void all_gather(const T* send, T* recv, size_t send_count) {
    all_gather(send, recv, send_count, dtype_of<T>());
  }
  template <typename T>
  void reduce_scatter(const T* send, T* recv, size_t recv_count, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter(send, recv, recv_count, dtype_of<T>(), op);
  }
  template <typename T>
  void broadcast(T* buf, size_t count, int root) {
    broadcast(buf, count, dtype_of<T>(), root);
  }
  template <typename T>
  void send_recv(const T* send, size_t send_count, int dst, T* recv, size_t recv_count, int src) {
    send_recv(send, send_count, dst, recv, recv_count, src, dtype_of<T>());
  }
  template <typename T>
  void all_to_all(const T* send, T* recv, size_t count) {
    all_to_all(send, recv, count, dtype_of<T>());
  }
  // Host-side scalar reductions, whatever the backend (uses the group's MPI communicator
  // for device backends too).
  virtual double all_reduce_scalar(double v, ReduceOp op) = 0;
};

}  // namespace easyctx::dist
