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
  // World ranks of the members: what a timeout's roll call asks and names.
  MPI_Group mine, world;
  check_mpi(MPI_Comm_group(comm_, &mine), "MPI_Comm_group");
  check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group(world)");
  std::vector<int> local(static_cast<size_t>(size_));
  for (int i = 0; i < size_; ++i) local[static_cast<size_t>(i)] = i;
  members_.resize(static_cast<size_t>(size_));
  check_mpi(MPI_Group_translate_ranks(mine, size_, local.data(), world, members_.data()), "MPI_Group_translate_ranks");
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
}

Watch MpiComm::begin(const char* op, size_t count) {
  fault_point(op, name_);
  Watch w;
  w.op = op;
  w.group = name_;
  w.count = count;
  w.timeout_s = timeout_s_;
  w.members = &members_;
  w.seq = ++seq_;
  return w;
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

// Issues one nonblocking call (returning its request) and waits for it under the watch.
template <typename Issue>
void watched(const Watch& w, const char* what, Issue issue) {
  MPI_Request q = MPI_REQUEST_NULL;
  check_mpi(issue(&q), what);
  wait_watched(&q, 1, w);
}
}  // namespace

// Floating-point sums are computed by each element's owner, adding the ranks' values in rank
// order (all-to-all of the blocks, then a local sum): all_reduce and reduce_scatter then give
// bit-identical sums for an element whatever the split, so ZeRO-3 equals stage 0 exactly and
// results never depend on which algorithm MPI picks for a message size.
void MpiComm::all_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) {
  const Watch w = begin("all_reduce", count);
  if (op == ReduceOp::Sum && is_float(t) && size_ > 1) {
    const size_t es = dtype_size(t), P = static_cast<size_t>(size_), block = (count + P - 1) / P;
    std::vector<char> padded(block * P * es, 0), blocks(block * P * es), mine(block * es);
    std::memcpy(padded.data(), send, count * es);
    all_to_all_impl(padded.data(), blocks.data(), block, t, w);
    sum_blocks(t, blocks.data(), mine.data(), block, size_);
    all_gather_impl(mine.data(), padded.data(), block, t, w);
    std::memcpy(recv, padded.data(), count * es);
    return;
  }
  MPI_Datatype mt = mpi_type(t, true);
  for (size_t off = 0; off < count; off += kChunk) {
    int n = static_cast<int>(std::min(kChunk, count - off));
    const void* s = send == recv ? MPI_IN_PLACE : at(send, off, t);
    watched(w, "MPI_Iallreduce",
            [&](MPI_Request* q) { return MPI_Iallreduce(s, at(recv, off, t), n, mt, mpi_op(op), comm_, q); });
  }
}

void MpiComm::reduce_scatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op) {
  const Watch w = begin("reduce_scatter", recv_count);
  if (op == ReduceOp::Sum && is_float(t) && size_ > 1) {  // fixed rank order (see all_reduce)
    const size_t es = dtype_size(t);
    std::vector<char> blocks(recv_count * static_cast<size_t>(size_) * es);
    all_to_all_impl(send, blocks.data(), recv_count, t, w);
    sum_blocks(t, blocks.data(), recv, recv_count, size_);
    return;
  }
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
    watched(w, "MPI_Ireduce_scatter_block", [&](MPI_Request* q) {
      return MPI_Ireduce_scatter_block(sb, recv, static_cast<int>(recv_count), mt, mpi_op(op), comm_, q);
    });
    return;
  }
  for (int root = 0; root < size_; ++root)
    for (size_t off = 0; off < recv_count; off += kChunk) {
      int n = static_cast<int>(std::min(kChunk, recv_count - off));
      const char* s = sb + (static_cast<size_t>(root) * recv_count + off) * dtype_size(t);
      watched(w, "MPI_Ireduce", [&](MPI_Request* q) {
        return MPI_Ireduce(s, root == rank_ ? at(recv, off, t) : nullptr, n, mt, mpi_op(op), root, comm_, q);
      });
    }
}

void MpiComm::all_gather(const void* send, void* recv, size_t send_count, DType t) {
  all_gather_impl(send, recv, send_count, t, begin("all_gather", send_count));
}

void MpiComm::all_gather_impl(const void* send, void* recv, size_t send_count, DType t, const Watch& w) {
  MPI_Datatype mt = mpi_type(t, false);
  char* own = at(recv, static_cast<size_t>(rank_) * send_count, t);
  if (send_count <= kChunk) {
    const void* s = send == own ? MPI_IN_PLACE : send;
    watched(w, "MPI_Iallgather", [&](MPI_Request* q) {
      return MPI_Iallgather(s, static_cast<int>(send_count), mt, recv, static_cast<int>(send_count), mt, comm_, q);
    });
    return;
  }
  if (send != own) std::memcpy(own, send, send_count * dtype_size(t));
  for (int root = 0; root < size_; ++root)
    for (size_t off = 0; off < send_count; off += kChunk) {
      int n = static_cast<int>(std::min(kChunk, send_count - off));
      watched(w, "MPI_Ibcast", [&](MPI_Request* q) {
        return MPI_Ibcast(at(recv, static_cast<size_t>(root) * send_count + off, t), n, mt, root, comm_, q);
      });
    }
}

void MpiComm::broadcast(void* buf, size_t count, DType t, int root) {
  const Watch w = begin("broadcast", count);
  MPI_Datatype mt = mpi_type(t, false);
  for (size_t off = 0; off < count; off += kChunk) {
    int n = static_cast<int>(std::min(kChunk, count - off));
    watched(w, "MPI_Ibcast", [&](MPI_Request* q) { return MPI_Ibcast(at(buf, off, t), n, mt, root, comm_, q); });
  }
}

void MpiComm::send_recv(const void* send, size_t send_count, int dst, void* recv, size_t recv_count, int src, DType t) {
  const Watch w = begin("send_recv", send_count);
  MPI_Datatype mt = mpi_type(t, false);
  if (dst == kNoPeer) dst = MPI_PROC_NULL;
  if (src == kNoPeer) src = MPI_PROC_NULL;
  size_t chunks = std::max((send_count + kChunk - 1) / kChunk, (recv_count + kChunk - 1) / kChunk);
  for (size_t c = 0; c < std::max<size_t>(chunks, 1); ++c) {
    size_t off = c * kChunk;
    int ns = off < send_count ? static_cast<int>(std::min(kChunk, send_count - off)) : 0;
    int nr = off < recv_count ? static_cast<int>(std::min(kChunk, recv_count - off)) : 0;
    MPI_Request q[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    check_mpi(MPI_Irecv(at(recv, std::min(off, recv_count), t), nr, mt, src, 7, comm_, &q[0]), "MPI_Irecv");
    check_mpi(MPI_Isend(at(send, std::min(off, send_count), t), ns, mt, dst, 7, comm_, &q[1]), "MPI_Isend");
    wait_watched(q, 2, w);
  }
}

void MpiComm::all_to_all(const void* send, void* recv, size_t count, DType t) {
  all_to_all_impl(send, recv, count, t, begin("all_to_all", count));
}

void MpiComm::all_to_all_impl(const void* send, void* recv, size_t count, DType t, const Watch& w) {
  MPI_Datatype mt = mpi_type(t, false);
  EASYCTX_CHECK(send != recv, "all_to_all on group '", name_, "': send and recv must differ");
  if (count <= kChunk) {
    watched(w, "MPI_Ialltoall", [&](MPI_Request* q) {
      return MPI_Ialltoall(send, static_cast<int>(count), mt, recv, static_cast<int>(count), mt, comm_, q);
    });
    return;
  }
  // Large blocks: pairwise shifted exchanges.
  std::memcpy(at(recv, static_cast<size_t>(rank_) * count, t), at(send, static_cast<size_t>(rank_) * count, t),
              count * dtype_size(t));
  for (int s = 1; s < size_; ++s) {
    int dst = (rank_ + s) % size_, src = (rank_ - s + size_) % size_;
    for (size_t off = 0; off < count; off += kChunk) {
      int n = static_cast<int>(std::min(kChunk, count - off));
      MPI_Request q[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
      check_mpi(MPI_Irecv(at(recv, static_cast<size_t>(src) * count + off, t), n, mt, src, 8, comm_, &q[0]),
                "MPI_Irecv(all_to_all)");
      check_mpi(MPI_Isend(at(send, static_cast<size_t>(dst) * count + off, t), n, mt, dst, 8, comm_, &q[1]),
                "MPI_Isend(all_to_all)");
      wait_watched(q, 2, w);
    }
  }
}

void MpiComm::barrier() {
  const Watch w = begin("barrier", 0);
  watched(w, "MPI_Ibarrier", [&](MPI_Request* q) { return MPI_Ibarrier(comm_, q); });
}

double MpiComm::all_reduce_scalar(double v, ReduceOp op) {
  const Watch w = begin("all_reduce_scalar", 1);
  double out = v;
  watched(w, "MPI_Iallreduce(scalar)",
          [&](MPI_Request* q) { return MPI_Iallreduce(&v, &out, 1, MPI_DOUBLE, mpi_op(op), comm_, q); });
  return out;
}

}  // namespace easyctx::dist
