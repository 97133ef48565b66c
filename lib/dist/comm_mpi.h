// MPI implementation of Comm (CPU backend): host buffers; each call issues nonblocking MPI
// operations and waits for them under the collective watchdog (dist/watchdog.h: the timeout,
// a roll call naming the rank that never arrived, abort). Counts above INT_MAX are split into
// chunks (MPI 3 counts are int).
#pragma once
#include <mpi.h>

#include <vector>

#include "dist/comm.h"
#include "dist/watchdog.h"

namespace easyctx::dist {

class MpiComm : public Comm {
 public:
  MpiComm(MPI_Comm comm, std::string name, double timeout_s);  // comm not owned
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  MemSpace memspace() const override { return MemSpace::Host; }
  const char* backend() const override { return "mpi"; }
  MPI_Comm mpi_comm() const { return comm_; }

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
  double all_reduce_scalar(double v, ReduceOp op) override;
  // World ranks of the group's members, in group-rank order.
  const std::vector<int>& members() const { return members_; }

 private:
  Watch begin(const char* op, size_t count);  // counts the operation, fault point, its watch
  void all_to_all_impl(const void* send, void* recv, size_t count, DType t, const Watch& w);
  void all_gather_impl(const void* send, void* recv, size_t send_count, DType t, const Watch& w);
  MPI_Comm comm_;
  std::string name_;
  double timeout_s_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> members_;
  long seq_ = 0;
};

MPI_Datatype mpi_type(DType t, bool for_reduction);
MPI_Op mpi_op(ReduceOp op);

}  // namespace easyctx::dist
