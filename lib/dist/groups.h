// Process groups. World = DP x SP with contiguous sequence-parallel groups (rank r has
// sp_rank = r % sp, dp_rank = r / sp), so ring and all-to-all traffic stays inside a node
// first. usp splits each SP group into contiguous Ulysses groups of ulysses_size ranks and
// strided ring groups across them. The ZeRO-3 shard group is the world (default) or the
// ranks of one node; with per-node sharding, `zero_replica` links the ranks that hold the
// same shard on different nodes (gradients are all-reduced across it).
//
// GroupLayout is pure arithmetic (tests and --print-config use it without MPI);
// ProcessGroups builds one Comm per group over MPI (CPU) or NCCL (CUDA).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "dist/comm.h"
#include "dist/runtime.h"

namespace easyctx::dist {

struct GroupLayout {
  int world_size = 1;
  int ranks_per_node = 1;  // layout assumes block placement: node = rank / ranks_per_node
  int dp_size = 1;
  int sp_size = 1;
  int ulysses_size = 1;  // usp: inner (contiguous) degree; else 1 (ulysses mode: = sp_size)
  int ring_size = 1;     // usp: outer degree; zigzag_ring/dist_flash: = sp_size
  ZeroGroupScope zero_scope = ZeroGroupScope::World;
  SeqParallelMode mode = SeqParallelMode::None;

  int dp_rank(int r) const { return r / sp_size; }
  int sp_rank(int r) const { return r % sp_size; }
  // Each list holds the world ranks of one group, in group-rank order.
  std::vector<std::vector<int>> dp_groups() const;
  std::vector<std::vector<int>> sp_groups() const;
  std::vector<std::vector<int>> ulysses_groups() const;
  std::vector<std::vector<int>> ring_groups() const;
  std::vector<std::vector<int>> zero_groups() const;
  std::vector<std::vector<int>> zero_replica_groups() const;
  std::string describe() const;  // the text --print-config prints
};

// Throws InputError (naming the key) when the config does not fit the world.
GroupLayout make_group_layout(const StageConfig& cfg, int world_size, int ranks_per_node);

enum class CommBackend { Mpi, Nccl };

class ProcessGroups {
 public:
  // Collective over the world: every rank must call it with the same layout.
  ProcessGroups(const Runtime& rt, const GroupLayout& layout, CommBackend backend, double timeout_s);
  // The same over the ranks of `parent` (not owned; e.g. MPI_COMM_WORLD or a part of it): the
  // layout's world is parent's ranks; with NCCL each rank takes the GPU of its rank among the
  // ranks of `parent` on its node.
  ProcessGroups(MPI_Comm parent, const GroupLayout& layout, CommBackend backend, double timeout_s);
  ~ProcessGroups();

  const GroupLayout& layout() const { return layout_; }
  Comm& world() { return *world_; }
  Comm& dp() { return *dp_; }
  Comm& sp() { return *sp_; }
  Comm& ulysses() { return *ulysses_; }
  Comm& ring() { return *ring_; }
  Comm& zero() { return *zero_; }
  Comm& zero_replica() { return *zero_replica_; }

 private:
  void build(MPI_Comm parent, int rank, int local_rank, CommBackend backend, double timeout_s);
  GroupLayout layout_;
  std::vector<MPI_Comm> mpi_comms_;
  std::unique_ptr<Comm> world_, dp_, sp_, ulysses_, ring_, zero_, zero_replica_;
};

// The backend for train.device: cuda needs a CUDA build and a visible GPU (error otherwise);
// auto picks NCCL when both hold, else MPI.
CommBackend choose_backend(DeviceKind device);
bool cuda_device_available();

// Creates a Comm over `mpi_comm` (not owned) for the given backend.
std::unique_ptr<Comm> make_comm(MPI_Comm mpi_comm, const std::string& name, CommBackend backend, double timeout_s);

}  // namespace easyctx::dist
