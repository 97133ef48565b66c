// NCCL implementation of Comm (CUDA backend): device buffers, operations enqueued on the
// comm's stream (its own non-blocking stream unless set_queue() names another). Bootstrap:
// rank 0 of the group calls ncclGetUniqueId, a watched broadcast over the group's MPI
// communicator, ncclCommInitRank under the watchdog. synchronize() waits with the collective
// timeout and aborts every rank (ncclCommAbort + MPI_Abort) when a peer never arrives; the
// host-side operations (barrier, all_reduce_scalar) are the group's MpiComm's, watched.
#pragma once
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <memory>

#include "dist/comm.h"
#include "dist/comm_mpi.h"

namespace easyctx::dist {

void check_nccl(ncclResult_t rc, const char* what, const std::string& group);
void check_cuda(cudaError_t rc, const char* what);

class NcclComm : public Comm {
 public:
  NcclComm(MPI_Comm comm, std::string name, double timeout_s);  // comm not owned
  ~NcclComm() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  MemSpace memspace() const override { return MemSpace::Device; }
  const char* backend() const override { return "nccl"; }

  using Comm::all_gather;
  using Comm::all_reduce;
  using Comm::all_to_all;
  using Comm::broadcast;
  using Comm::reduce_scatter;
  using Comm::send_recv;
  void all_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) override;
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op) override;
  void all_gather(const void* send, void* recv, size_t send_count, DType t) override;
  void broadcast(void* buf, size_t count, DType t, int root) override;
  void send_recv(const void* send, size_t send_count, int dst, void* recv, size_t recv_count, int src,
                 DType t) override;
  void all_to_all(const void* send, void* recv, size_t count, DType t) override;
  void barrier() override;
  void synchronize() override;
  void set_queue(Queue* q) override { stream_ = q ? static_cast<cudaStream_t>(q->native()) : own_stream_; }
  // The fence is watched (dist/watchdog.h): a peer that never arrives aborts every rank.
  Fence record() override;
  void wait(const Fence& f) override;
  double all_reduce_scalar(double v, ReduceOp op) override;

 private:
  MPI_Comm mpi_;
  std::unique_ptr<MpiComm> host_;  // the same group over MPI: host-side operations
  std::string name_;
  double timeout_s_;
  int rank_ = 0;
  int size_ = 1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t own_stream_ = nullptr;
  cudaStream_t stream_ = nullptr;
  // The last operation issued and its element count (what a stalled fence's message names).
  const char* last_op_ = "nothing";
  size_t last_count_ = 0;
  void issued(const char* op, size_t count) {
    last_op_ = op;
    last_count_ = count;
  }
};

}  // namespace easyctx::dist
