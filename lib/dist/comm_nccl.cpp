#include "dist/comm_nccl.h"

#include <chrono>
#include <thread>

#include "core/cuda_queue.h"
#include "core/error.h"
#include "dist/runtime.h"
#include "dist/watchdog.h"

namespace easyctx::dist {
namespace {
ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
    case DType::U32: return ncclUint32;
    case DType::U64: return ncclUint64;
  }
  EASYCTX_THROW("unknown dtype");
}
ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}
}  // namespace

void check_nccl(ncclResult_t rc, const char* what, const std::string& group) {
  if (rc == ncclSuccess || rc == ncclInProgress) return;
  EASYCTX_THROW("[", process_label(), "] ", what, " on group '", group, "' failed: ", ncclGetErrorString(rc), " (",
                ncclGetLastError(nullptr), ")");
}

void check_cuda(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return;
  EASYCTX_THROW("[", process_label(), "] ", what, " failed: ", cudaGetErrorString(rc));
}

NcclComm::NcclComm(MPI_Comm comm, std::string name, double timeout_s)
    : mpi_(comm), name_(std::move(name)), timeout_s_(timeout_s) {
  host_ = std::make_unique<MpiComm>(mpi_, name_, timeout_s_);
  rank_ = host_->rank();
  size_ = host_->size();
  ncclUniqueId id;
  if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", name_);
  host_->broadcast(&id, sizeof id, DType::U8, 0);
  {
    // Blocks until every rank of the group joined: the monitor thread watches it.
    fault_point("ncclCommInitRank", name_);
    WatchdogGuard guard("ncclCommInitRank", name_, 0, timeout_s_);
    check_nccl(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank", name_);
  }
  check_cuda(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = own_stream_;
}

NcclComm::~NcclComm() {
  if (comm_) ncclCommDestroy(comm_);
  if (own_stream_) cudaStreamDestroy(own_stream_);
}

void NcclComm::all_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
  fault_point("all_reduce", name_);
  issued("ncclAllReduce", count);
  check_nccl(ncclAllReduce(send, recv, count, nccl_type(t), nccl_op(op), comm_, stream_), "ncclAllReduce", name_);
}
void NcclComm::reduce_scatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op) {
  fault_point("reduce_scatter", name_);
  issued("ncclReduceScatter", recv_count);
  check_nccl(ncclReduceScatter(send, recv, recv_count, nccl_type(t), nccl_op(op), comm_, stream_), "ncclReduceScatter",
             name_);
}
void NcclComm::all_gather(const void* send, void* recv, size_t send_count, DType t) {
  fault_point("all_gather", name_);
  issued("ncclAllGather", send_count);
  check_nccl(ncclAllGather(send, recv, send_count, nccl_type(t), comm_, stream_), "ncclAllGather", name_);
}
void NcclComm::broadcast(void* buf, size_t count, DType t, int root) {
  fault_point("broadcast", name_);
  issued("ncclBroadcast", count);
  check_nccl(ncclBroadcast(buf, buf, count, nccl_type(t), root, comm_, stream_), "ncclBroadcast", name_);
}
void NcclComm::send_recv(const void* send, size_t send_count, int dst, void* recv, size_t recv_count, int src,
                         DType t) {
  fault_point("send_recv", name_);
  issued("ncclSend/ncclRecv", send_count);
  check_nccl(ncclGroupStart(), "ncclGroupStart", name_);
  if (dst != kNoPeer) check_nccl(ncclSend(send, send_count, nccl_type(t), dst, comm_, stream_), "ncclSend", name_);
  if (src != kNoPeer) check_nccl(ncclRecv(recv, recv_count, nccl_type(t), src, comm_, stream_), "ncclRecv", name_);
  check_nccl(ncclGroupEnd(), "ncclGroupEnd", name_);
}
void NcclComm::all_to_all(const void* send, void* recv, size_t count, DType t) {
  EASYCTX_CHECK(send != recv, "all_to_all on group '", name_, "': send and recv must differ");
  fault_point("all_to_all", name_);
  issued("all-to-all (ncclSend/ncclRecv)", count);
  size_t bytes = count * dtype_size(t);
  check_nccl(ncclGroupStart(), "ncclGroupStart", name_);
  for (int p = 0; p < size_; ++p) {
    check_nccl(ncclSend(static_cast<const char*>(send) + static_cast<size_t>(p) * bytes, count, nccl_type(t), p, comm_,
                        stream_),
               "ncclSend", name_);
    check_nccl(
        ncclRecv(static_cast<char*>(recv) + static_cast<size_t>(p) * bytes, count, nccl_type(t), p, comm_, stream_),
        "ncclRecv", name_);
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd", name_);
}

Fence NcclComm::record() {
  Fence f = cuda_queue::record(stream_);
  watch_fence(stream_, f, last_op_, name_, last_count_, timeout_s_);
  return f;
}

void NcclComm::wait(const Fence& f) { cuda_queue::wait(stream_, f); }

void NcclComm::synchronize() {
  auto start = std::chrono::steady_clock::now();
  for (long spin = 0;; ++spin) {
    cudaError_t q = cudaStreamQuery(stream_);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) check_cuda(q, "cudaStreamQuery");
    ncclResult_t async = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError", name_);
    check_nccl(async, "NCCL asynchronous error", name_);
    double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (el > timeout_s_) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      abort_all(
          timeout_message(std::string(last_op_) + " (the last NCCL operation issued)", name_, last_count_, timeout_s_) +
              ": a peer rank has failed or is stuck; aborting all ranks",
          3);
    }
    if (spin % 256 == 255) answer_roll_calls();  // ranks stuck in MPI ask what this one waits in
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclComm::barrier() {
  synchronize();
  host_->barrier();
}

double NcclComm::all_reduce_scalar(double v, ReduceOp op) { return host_->all_reduce_scalar(v, op); }

}  // namespace easyctx::dist
