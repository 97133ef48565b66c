#include "dist/comm_mpi.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "dist/runtime.h"
#include "dist/watchdog.h"

namespace easyctx::dist {
namespace {
constexpr size_t kChunk = static_cast<size_t>(INT_MAX) / 2;  // elements per MPI call (int counts)

const char* at(const void* p, size_t elems, DType t) { return static_cast<const char*>(p) + elems * dtype_size(t); }
char* at(void* p, size_t elems, DType t) { return static_cast<char*>(p) + elems * dtype_size(t); }
}  // namespace

MPI_Datatype mpi_type(DType t, bool for_reduction) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
    case DType::U32: return MPI_UINT32_T;
    case DType::U64: return MPI_UINT64_T;
    case DType::BF16:
    case DType::F16:
      // 16-bit floats move as raw 16-bit words; MPI cannot reduce them.
      EASYCTX_CHECK(!for_reduction, "MPI backend cannot reduce ", dtype_name(t), " (reduce in f32)");
      return MPI_UINT16_T;
  }
  EASYCTX_THROW("unknown dtype");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

MpiComm::MpiComm(MPI_Comm comm, std::string name, double timeout_s)
    : comm_(comm), name_(std::move(name)), timeout_s_(timeout_s) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

namespace {
bool is_float(DType t) { return t == DType::F32 || t == DType::F64; }

// out = sum over j of in[j * n + i], j in rank order: the fixed order that makes a floating
// sum independent of how the data was split across collectives.
template <typename T>
void sum_blocks(const void* in, void* out, size_t n, int P) {
  const T* a = static_cast<const T*>(in);
  T* o = static_cast<T*>(out);
  for (size_t i = 0; i < n; ++i) o[i] = a[i];
  for (int j = 1; j < P; ++j)
    for (size_t i = 0; i < n; ++i) o[i] += a[static_cast<size_t>(j) * n + i];
}
void sum_blocks(DType t, const void* in, void* out, size_t n, int P) {
  if (t == DType::F32) sum_blocks<float>(in, out, n, P);
  else sum_blocks<double>(in, out, n, P);
}
}  // namespace

// Floating-point sums are computed by each element's owner, adding the ranks' values in rank
// order (all-to-all of the blocks, then a local sum): all_reduce and reduce_scatter then give
// bit-identical sums for an element whatever the split, so ZeRO-3 equals stage 0 exactly and
// results never depend on which algorithm MPI picks for a message size.
void MpiComm::all_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
  if (op == ReduceOp::Sum && is_float(t) && size_ > 1) {
    WatchdogGuard g("all_reduce", name_, count, timeout_s_);
    const size_t es = dtype_size(t), P = static_cast<size_t>(size_), block = (count + P - 1) / P;
    std::vector<char> padded(block * P * es, 0), blocks(block * P * es), mine(block * es);
    std::memcpy(padded.data(), send, count * es);
    all_to_all(padded.data(), blocks.data(), block, t);
    sum_blocks(t, blocks.data(), mine.data(), block, size_);
    all_gather(mine.data(), padded.data(), block, t);
    std::memcpy(recv, padded.data(), count * es);
    return;
  }
  WatchdogGuard g("all_reduce", name_, count, timeout_s_);
  MPI_Datatype mt = mpi_type(t, true);
  for (size_t off = 0; off < count; off += kChunk) {
    int n = static_cast<int>(std::min(kChunk, count - off));
    const void* s = send == recv ? MPI_IN_PLACE : at(send, off, t);
    check_mpi(MPI_Allreduce(s, at(recv, off, t), n, mt, mpi_op(op), comm_), "MPI_Allreduce");
  }
}

void MpiComm::reduce_scatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op) {
  if (op == ReduceOp::Sum && is_float(t) && size_ > 1) {  // fixed rank order (see all_reduce)
    WatchdogGuard g("reduce_scatter", name_, recv_count, timeout_s_);
    const size_t es = dtype_size(t);
    std::vector<char> blocks(recv_count * static_cast<size_t>(size_) * es);
    all_to_all(send, blocks.data(), recv_count, t);
    sum_blocks(t, blocks.data(), recv, recv_count, size_);
    return;
  }
  WatchdogGuard g("reduce_scatter", name_, recv_count, timeout_s_);
  MPI_Datatype mt = mpi_type(t, true);
  size_t bytes = recv_count * dtype_size(t);
  // recv may alias its own block of send: stage through a copy then.
  const char* sb = static_cast<const char*>(send);
  const char* rb = static_cast<const char*>(recv);
  std::vector<char> staged;
  if (rb < sb + bytes * static_cast<size_t>(size_) && sb < rb + bytes) {
    staged.assign(sb, sb + bytes * static_cast<size_t>(size_));
    sb = staged.data();
  }
  if (recv_count <= kChunk) {
    check_mpi(MPI_Reduce_scatter_block(sb, recv, static_cast<int>(recv_count), mt, mpi_op(op), comm_),
              "MPI_Reduce_scatter_block");
    return;
  }
  for (int root = 0; root < size_; ++root)
    for (size_t off = 0; off < recv_count; off += kChunk) {
      int n = static_cast<int>(std::min(kChunk, recv_count - off));
      const char* s = sb + (static_cast<size_t>(root) * recv_count + off) * dtype_size(t);
      check_mpi(MPI_Reduce(s, root == rank_ ? at(recv, off, t) : nullptr, n, mt, mpi_op(op), root, comm_),
                "MPI_Reduce");
    }
}

void MpiComm::all_gather(const void* send, void* recv, size_t send_count, DType t) {
  WatchdogGuard g("all_gather", name_, send_count, timeout_s_);
  MPI_Datatype mt = mpi_type(t, false);
  char* own = at(recv, static_cast<size_t>(rank_) * send_count, t);
  if (send_count <= kChunk) {
    const void* s = send == own ? MPI_IN_PLACE : send;
    check_mpi(MPI_Allgather(s, static_cast<int>(send_count), mt, recv, static_cast<int>(send_count), mt, comm_),
              "MPI_Allgather");
    return;
  }
  if (send != own) std::memcpy(own, send, send_count * dtype_size(t));
  for (int root = 0; root < size_; ++root)
    for (size_t off = 0; off < send_count; off += kChunk) {
      int n = static_cast<int>(std::min(kChunk, send_count - off));
      check_mpi(MPI_Bcast(at(recv, static_cast<size_t>(root) * send_count + off, t), n, mt, root, comm_), "MPI_Bcast");
    }
}

void MpiComm::broadcast(void* buf, size_t count, DType t, int root) {
  WatchdogGuard g("broadcast", name_, count, timeout_s_);
  MPI_Datatype mt = mpi_type(t, false);
  for (size_t off = 0; off < count; off += kChunk) {
    int n = static_cast<int>(std::min(kChunk, count - off));
    check_mpi(MPI_Bcast(at(buf, off, t), n, mt, root, comm_), "MPI_Bcast");
  }
}

void MpiComm::send_recv(const void* send, size_t send_count, int dst, void* recv, size_t recv_count, int src,
                        DType t) {
  WatchdogGuard g("send_recv", name_, send_count, timeout_s_);
  MPI_Datatype mt = mpi_type(t, false);
  if (dst == kNoPeer) dst = MPI_PROC_NULL;
  if (src == kNoPeer) src = MPI_PROC_NULL;
  size_t chunks = std::max((send_count + kChunk - 1) / kChunk, (recv_count + kChunk - 1) / kChunk);
  for (size_t c = 0; c < std::max<size_t>(chunks, 1); ++c) {
    size_t off = c * kChunk;
    int ns = off < send_count ? static_cast<int>(std::min(kChunk, send_count - off)) : 0;
    int nr = off < recv_count ? static_cast<int>(std::min(kChunk, recv_count - off)) : 0;
    check_mpi(MPI_Sendrecv(at(send, std::min(off, send_count), t), ns, mt, dst, 7,
                           at(recv, std::min(off, recv_count), t), nr, mt, src, 7, comm_, MPI_STATUS_IGNORE),
              "MPI_Sendrecv");
  }
}

void MpiComm::all_to_all(const void* send, void* recv, size_t count, DType t) {
  WatchdogGuard g("all_to_all", name_, count, timeout_s_);
  MPI_Datatype mt = mpi_type(t, false);
  EASYCTX_CHECK(send != recv, "all_to_all on group '", name_, "': send and recv must differ");
  if (count <= kChunk) {
    check_mpi(MPI_Alltoall(send, static_cast<int>(count), mt, recv, static_cast<int>(count), mt, comm_),
              "MPI_Alltoall");
    return;
  }
  // Large blocks: pairwise shifted exchanges.
  std::memcpy(at(recv, static_cast<size_t>(rank_) * count, t), at(send, static_cast<size_t>(rank_) * count, t),
              count * dtype_size(t));
  for (int s = 1; s < size_; ++s) {
    int dst = (rank_ + s) % size_, src = (rank_ - s + size_) % size_;
    for (size_t off = 0; off < count; off += kChunk) {
      int n = static_cast<int>(std::min(kChunk, count - off));
      check_mpi(MPI_Sendrecv(at(send, static_cast<size_t>(dst) * count + off, t), n, mt, dst, 8,
                             at(recv, static_cast<size_t>(src) * count + off, t), n, mt, src, 8, comm_,
                             MPI_STATUS_IGNORE),
                "MPI_Sendrecv(all_to_all)");
    }
  }
}

void MpiComm::barrier() {
  WatchdogGuard g("barrier", name_, 0, timeout_s_);
  check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
}

double MpiComm::all_reduce_scalar(double v, ReduceOp op) {
  WatchdogGuard g("all_reduce_scalar", name_, 1, timeout_s_);
  double out = v;
  check_mpi(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, mpi_op(op), comm_), "MPI_Allreduce(scalar)");
  return out;
}

}  // namespace easyctx::dist
