// The machine a memory plan is for: backend, GPU model and memory, ranks per node, nodes and
// host memory per node, from the config's `target` section, the launch (MPI world, ranks
// per node) and this machine (the visible GPU, /proc/meminfo). Only device queries touch
// CUDA (cudaGetDeviceProperties: no context, no allocation).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace easyctx::plan {

// GPU models target.gpu knows, with their memory as CUDA reports it (cudaDeviceProp::
// totalGlobalMem, what a run on that GPU plans with; the CUDA context comes out of it). The
// H200's is measured on one (150,109,880,320 bytes, driver 580): 615 MiB below nvidia-smi's
// 143,771 MiB total, the driver's reserve. The others are nvidia-smi's totals, which a run on
// them sees ~0.6 GiB lower the same way: a plan made for them on a login node is that much
// optimistic (within target.headroom's 2%), and the run's own plan has the last word.
// host_bytes_per_gpu: the host memory a node of these GPUs has per GPU in NVIDIA's DGX system
// (what --plan assumes for target.gpu when target.host_memory_gib is not given).
struct GpuModel {
  const char* name;
  int64_t memory_bytes;
  int64_t host_bytes_per_gpu;
};
const std::vector<GpuModel>& known_gpus();

struct PlanTarget {
  DeviceKind backend = DeviceKind::Cpu;  // Cpu or Cuda (never Auto)
  std::string gpu_name;                  // "" on the CPU backend
  int64_t gpu_memory_bytes = 0;          // one GPU (0 on the CPU backend)
  int gpus_per_node = 1;                 // ranks per node (processes per node on the CPU backend)
  int nodes = 1;
  int64_t host_memory_bytes = 0;        // one node
  double headroom = 0.03;               // share of each GPU's and node's memory kept free
  int64_t process_bytes = 0;            // this process's VmRSS when the target was resolved, for a
                                        // plan made in the program it plans for (0: not)
  std::string gpu_source, host_source;  // where the numbers came from (for the printout)
  int world() const { return gpus_per_node * nodes; }
};

// A Hopper GPU (sm_90: H100, H200, GH200, H800, H20) by its name ("H200", "NVIDIA H100 80GB HBM3").
bool is_hopper_gpu(const std::string& gpu_name);

// For `easyctx_train STAGE.yaml --plan` (also on a login node without GPUs): target.* keys
// first, then the launch (world_size ranks, ranks_per_node per node) and this machine. Host
// memory: target.host_memory_gib; else, for a known GPU named by target.gpu, its DGX node's
// (never the login node's); else this machine's (for another GPU, the source says so).
// train.device auto plans for cuda when a GPU is visible or target.gpu(_memory_gib) names one.
// Throws InputError naming the key when the GPU cannot be determined or is unknown.
PlanTarget resolve_target(const StageConfig& cfg, int world_size, int ranks_per_node);
// For a running job: the launch and the visible device win over target.*, whose GPU keys
// only serve when no device can be queried; host memory is this machine's.
PlanTarget run_target(const StageConfig& cfg, int world_size, int ranks_per_node);

// The world `easyctx_train --print-config` lays the process groups out for: target.nodes x
// target.gpus_per_node when both are set; else the launch when it has more than one rank or
// the config fits one rank; else (one process, as on a login node) the smallest world the
// config needs, parallel.sequence.size ranks on one node. `note` says which, for the printout.
struct LayoutWorld {
  int world = 1;
  int ranks_per_node = 1;
  std::string note;
};
LayoutWorld print_config_world(const StageConfig& cfg, int launch_world, int launch_ranks_per_node);

// /proc/meminfo MemTotal in bytes; throws Error when unreadable.
int64_t host_memory_total();
// /proc/self/status VmHWM (peak resident set of this process) in bytes; -1 when unreadable.
int64_t vm_hwm_bytes();
// /proc/self/status VmRSS (resident set now) in bytes; -1 when unreadable.
int64_t vm_rss_bytes();

}  // namespace easyctx::plan
