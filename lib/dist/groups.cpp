#include "dist/groups.h"

#include <numeric>
#include <sstream>

#include "core/error.h"
#include "dist/comm_mpi.h"
#include "dist/watchdog.h"
#ifdef EASYCTX_HAVE_CUDA
#include <cuda_runtime.h>

#include "dist/comm_nccl.h"
#endif

namespace easyctx::dist {

GroupLayout make_group_layout(const StageConfig& cfg, int world_size, int ranks_per_node) {
  validate_for_world(cfg, world_size);
  GroupLayout L;
  L.world_size = world_size;
  L.ranks_per_node = std::max(1, ranks_per_node);
  L.sp_size = static_cast<int>(cfg.parallel.sequence.size);
  L.dp_size = world_size / L.sp_size;
  L.mode = cfg.parallel.sequence.mode;
  L.zero_scope = cfg.parallel.zero.group;
  switch (L.mode) {
    case SeqParallelMode::None: break;
    case SeqParallelMode::Ulysses: L.ulysses_size = L.sp_size; break;
    case SeqParallelMode::ZigzagRing:
    case SeqParallelMode::DistFlash: L.ring_size = L.sp_size; break;
    case SeqParallelMode::Usp: {
      int u = static_cast<int>(cfg.parallel.sequence.ulysses_size);
      if (u == 0) u = std::gcd(L.sp_size, L.ranks_per_node);  // inside a node, dividing the group
      L.ulysses_size = u;
      L.ring_size = L.sp_size / u;
      break;
    }
  }
  if (L.zero_scope == ZeroGroupScope::Node) {
    const std::string& src = cfg.source.empty() ? std::string("config") : cfg.source;
    EASYCTX_CHECK_INPUT(world_size % L.ranks_per_node == 0, src,
                        ": parallel.zero.group = node needs the same "
                        "number of ranks on every node (world ",
                        world_size, ", ", L.ranks_per_node, " per node)");
  }
  return L;
}

std::vector<std::vector<int>> GroupLayout::sp_groups() const {
  std::vector<std::vector<int>> g(static_cast<size_t>(dp_size));
  for (int r = 0; r < world_size; ++r) g[static_cast<size_t>(dp_rank(r))].push_back(r);
  return g;
}
std::vector<std::vector<int>> GroupLayout::dp_groups() const {
  std::vector<std::vector<int>> g(static_cast<size_t>(sp_size));
  for (int r = 0; r < world_size; ++r) g[static_cast<size_t>(sp_rank(r))].push_back(r);
  return g;
}
std::vector<std::vector<int>> GroupLayout::ulysses_groups() const {
  // Contiguous blocks of ulysses_size inside each SP group.
  std::vector<std::vector<int>> g(static_cast<size_t>(world_size / ulysses_size));
  for (int r = 0; r < world_size; ++r) g[static_cast<size_t>(r / ulysses_size)].push_back(r);
  return g;
}
std::vector<std::vector<int>> GroupLayout::ring_groups() const {
  // Inside each SP group, ranks with the same Ulysses index, strided by ulysses_size.
  std::vector<std::vector<int>> g;
  for (int d = 0; d < dp_size; ++d)
    for (int u = 0; u < ulysses_size; ++u) {
      std::vector<int> ring;
      for (int k = 0; k < ring_size; ++k) ring.push_back(d * sp_size + k * ulysses_size + u);
      g.push_back(ring);
    }
  return g;
}
std::vector<std::vector<int>> GroupLayout::zero_groups() const {
  if (zero_scope == ZeroGroupScope::World) {
    std::vector<int> all(static_cast<size_t>(world_size));
    std::iota(all.begin(), all.end(), 0);
    return {all};
  }
  std::vector<std::vector<int>> g(static_cast<size_t>(world_size / ranks_per_node));
  for (int r = 0; r < world_size; ++r) g[static_cast<size_t>(r / ranks_per_node)].push_back(r);
  return g;
}
std::vector<std::vector<int>> GroupLayout::zero_replica_groups() const {
  if (zero_scope == ZeroGroupScope::World) {
    std::vector<std::vector<int>> g;
    for (int r = 0; r < world_size; ++r) g.push_back({r});
    return g;
  }
  std::vector<std::vector<int>> g(static_cast<size_t>(ranks_per_node));
  for (int r = 0; r < world_size; ++r) g[static_cast<size_t>(r % ranks_per_node)].push_back(r);
  return g;
}

namespace {
void print_groups(std::ostringstream& os, const char* title, const std::vector<std::vector<int>>& groups) {
  os << "  " << title << " (" << groups.size() << " x " << (groups.empty() ? 0 : groups[0].size()) << "):";
  for (const auto& g : groups) {
    os << " [";
    for (size_t i = 0; i < g.size(); ++i) os << (i ? " " : "") << g[i];
    os << "]";
  }
  os << "\n";
}
}  // namespace

std::string GroupLayout::describe() const {
  std::ostringstream os;
  os << "process groups: world " << world_size << " = " << dp_size << " data-parallel x " << sp_size
     << " sequence-parallel (mode " << to_string(mode) << "), " << (world_size / ranks_per_node) << " node(s) x "
     << ranks_per_node << " rank(s)\n";
  print_groups(os, "sequence-parallel groups", sp_groups());
  print_groups(os, "data-parallel groups", dp_groups());
  if (mode == SeqParallelMode::Usp) {
    print_groups(os, "ulysses groups", ulysses_groups());
    print_groups(os, "ring groups", ring_groups());
  }
  os << "  ZeRO shard group scope: " << to_string(zero_scope) << "\n";
  print_groups(os, "ZeRO shard groups", zero_groups());
  if (zero_scope == ZeroGroupScope::Node) print_groups(os, "ZeRO replica groups", zero_replica_groups());
  return os.str();
}

bool cuda_device_available() {
#ifdef EASYCTX_HAVE_CUDA
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return false;
#endif
}

CommBackend choose_backend(DeviceKind device) {
  switch (device) {
    case DeviceKind::Cpu: return CommBackend::Mpi;
    case DeviceKind::Cuda:
#ifndef EASYCTX_HAVE_CUDA
      EASYCTX_THROW_INPUT("train.device: cuda: this build has no CUDA backend (rebuild with -DEASYCTX_CUDA=ON)");
#endif
      EASYCTX_CHECK_INPUT(cuda_device_available(), "train.device: cuda: no CUDA device is visible");
      return CommBackend::Nccl;
    case DeviceKind::Auto: return cuda_device_available() ? CommBackend::Nccl : CommBackend::Mpi;
  }
  return CommBackend::Mpi;
}

std::unique_ptr<Comm> make_comm(MPI_Comm mpi_comm, const std::string& name, CommBackend backend, double timeout_s) {
  if (backend == CommBackend::Mpi) return std::make_unique<MpiComm>(mpi_comm, name, timeout_s);
#ifdef EASYCTX_HAVE_CUDA
  return std::make_unique<NcclComm>(mpi_comm, name, timeout_s);
#else
  EASYCTX_THROW("the NCCL backend is not compiled in (build with a CUDA compiler, -DEASYCTX_CUDA=ON)");
#endif
}

ProcessGroups::ProcessGroups(const Runtime& rt, const GroupLayout& layout, CommBackend backend, double timeout_s)
    : layout_(layout) {
  EASYCTX_CHECK(layout.world_size == rt.size(), "group layout is for ", layout.world_size, " ranks but the world has ",
                rt.size());
  build(MPI_COMM_WORLD, rt.rank(), rt.topology().local_rank, backend, timeout_s);
}

ProcessGroups::ProcessGroups(MPI_Comm parent, const GroupLayout& layout, CommBackend backend, double timeout_s)
    : layout_(layout) {
  int rank = 0, size = 1, local_rank = 0;
  check_mpi(MPI_Comm_rank(parent, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(parent, &size), "MPI_Comm_size");
  EASYCTX_CHECK(layout.world_size == size, "group layout is for ", layout.world_size,
                " ranks but the communicator has ", size);
  MPI_Comm node;
  check_mpi(MPI_Comm_split_type(parent, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  check_mpi(MPI_Comm_rank(node, &local_rank), "MPI_Comm_rank");
  MPI_Comm_free(&node);
  build(parent, rank, local_rank, backend, timeout_s);
}

void ProcessGroups::build(MPI_Comm parent, int rank, int local_rank, CommBackend backend, double timeout_s) {
  const GroupLayout& layout = layout_;
#ifdef EASYCTX_HAVE_CUDA
  if (backend == CommBackend::Nccl) {
    int n = 0;
    EASYCTX_CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n > 0, "NCCL backend: no CUDA device visible");
    EASYCTX_CHECK(cudaSetDevice(local_rank % n) == cudaSuccess, "cudaSetDevice failed");
  }
#else
  (void)local_rank;
#endif
  auto split = [&](const std::vector<std::vector<int>>& groups, const char* name) {
    int color = -1, key = 0;
    for (size_t gi = 0; gi < groups.size(); ++gi)
      for (size_t i = 0; i < groups[gi].size(); ++i)
        if (groups[gi][i] == rank) {
          color = static_cast<int>(gi);
          key = static_cast<int>(i);
        }
    EASYCTX_CHECK(color >= 0, "rank ", rank, " is in no ", name, " group");
    MPI_Comm c;
    fault_point("create group", name);
    {
      // Collective over the parent, with no nonblocking form: the monitor thread watches it.
      WatchdogGuard guard("MPI_Comm_split (creating the group)", name, 0, timeout_s);
      check_mpi(MPI_Comm_split(parent, color, key, &c), "MPI_Comm_split");
    }
    mpi_comms_.push_back(c);
    return make_comm(c, name, backend, timeout_s);
  };
  std::vector<int> all(static_cast<size_t>(layout.world_size));
  std::iota(all.begin(), all.end(), 0);
  world_ = split({all}, "world");
  dp_ = split(layout.dp_groups(), "dp");
  sp_ = split(layout.sp_groups(), "sp");
  ulysses_ = split(layout.ulysses_groups(), "ulysses");
  ring_ = split(layout.ring_groups(), "ring");
  zero_ = split(layout.zero_groups(), "zero");
  zero_replica_ = split(layout.zero_replica_groups(), "zero_replica");
}

ProcessGroups::~ProcessGroups() {
  world_.reset();
  dp_.reset();
  sp_.reset();
  ulysses_.reset();
  ring_.reset();
  zero_.reset();
  zero_replica_.reset();
  for (auto& c : mpi_comms_) MPI_Comm_free(&c);
}

}  // namespace easyctx::dist
