#include "plan/target.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#ifdef EASYCTX_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "core/error.h"

namespace easyctx::plan {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string known_names() {
  std::string s;
  for (const GpuModel& g : known_gpus()) s += (s.empty() ? "" : ", ") + std::string(g.name);
  return s;
}

struct DeviceInfo {
  bool visible = false;
  std::string name;
  int64_t memory_bytes = 0;
};

// The current CUDA device's name and memory (cudaGetDeviceProperties creates no context).
DeviceInfo query_device() {
  DeviceInfo d;
#ifdef EASYCTX_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return d;
  }
  int dev = 0;
  cudaDeviceProp prop{};
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, dev);
  EASYCTX_CHECK(e == cudaSuccess, "memory plan: cudaGetDeviceProperties failed: ", cudaGetErrorString(e));
  d.visible = true;
  d.name = prop.name;
  d.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
#endif
  return d;
}

// Backend: train.device, with auto = cuda when a GPU is visible or the target names one.
DeviceKind plan_backend(const StageConfig& cfg, const DeviceInfo& dev) {
  if (cfg.train.device != DeviceKind::Auto) return cfg.train.device;
  const bool target_gpu = !cfg.target.gpu.empty() || cfg.target.gpu_memory_gib > 0;
  return dev.visible || target_gpu ? DeviceKind::Cuda : DeviceKind::Cpu;
}

// GPU name and memory from the target keys (prefer_device: the visible device first).
void resolve_gpu(const StageConfig& cfg, const DeviceInfo& dev, bool prefer_device, PlanTarget& t) {
  const TargetConfig& tc = cfg.target;
  const std::string src = cfg.source.empty() ? std::string("config") : cfg.source;
  if (dev.visible && (prefer_device || tc.gpu.empty())) {
    t.gpu_name = dev.name;
    t.gpu_memory_bytes = dev.memory_bytes;
    t.gpu_source = "visible device";
    if (!prefer_device && tc.gpu_memory_gib > 0) {
      t.gpu_memory_bytes = static_cast<int64_t>(tc.gpu_memory_gib * kGiB);
      t.gpu_source = "target.gpu_memory_gib";
    }
    return;
  }
  t.gpu_name = tc.gpu;
  if (tc.gpu_memory_gib > 0) {
    t.gpu_memory_bytes = static_cast<int64_t>(tc.gpu_memory_gib * kGiB);
    t.gpu_source = "target.gpu_memory_gib";
    if (t.gpu_name.empty()) t.gpu_name = "GPU";
    return;
  }
  EASYCTX_CHECK_INPUT(!tc.gpu.empty(), src,
                      ": target.gpu: no GPU is visible here to plan for; name the GPU "
                      "(target.gpu: one of ",
                      known_names(), ") or give its memory (target.gpu_memory_gib)");
  for (const GpuModel& g : known_gpus())
    if (upper(g.name) == upper(tc.gpu)) {
      t.gpu_name = g.name;
      t.gpu_memory_bytes = g.memory_bytes;
      t.gpu_source = "target.gpu";
      return;
    }
  EASYCTX_THROW_INPUT(src, ": target.gpu: unknown GPU '", tc.gpu, "': expected one of ", known_names(),
                      ", or any name together with target.gpu_memory_gib");
}

int64_t host_memory(const StageConfig& cfg, bool use_target, std::string& source) {
  if (use_target && cfg.target.host_memory_gib > 0) {
    source = "target.host_memory_gib";
    return static_cast<int64_t>(cfg.target.host_memory_gib * kGiB);
  }
  source = "/proc/meminfo of this machine";
  return host_memory_total();
}

// Reads "<key>: <n> kB" from a /proc file; -1 when absent.
int64_t proc_kb(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, key.size() + 1, key + ":") == 0) {
      std::istringstream is(line.substr(key.size() + 1));
      int64_t kb = -1;
      is >> kb;
      return kb < 0 ? -1 : kb * 1024;
    }
  return -1;
}

}  // namespace

const std::vector<GpuModel>& known_gpus() {
  static const std::vector<GpuModel> g = {
      // DGX A100 320GB: 1 TiB for 8 GPUs; DGX A100 640GB, DGX H100, DGX H200: 2 TiB.
      {"A100-40GB", 40960 * kMiB, 128 * 1024 * kMiB},
      {"A100-80GB", 81920 * kMiB, 256 * 1024 * kMiB},
      {"H100-80GB", 81559 * kMiB, 256 * 1024 * kMiB},
      {"H200", int64_t{150109880320},
       256 * 1024 * kMiB},  // measured (bench/RESULTS.md, 2026-12-02); nvidia-smi: 143,771 MiB
  };
  return g;
}

PlanTarget resolve_target(const StageConfig& cfg, int world_size, int ranks_per_node) {
  EASYCTX_CHECK(world_size >= 1 && ranks_per_node >= 1, "resolve_target: world ", world_size, ", ranks per node ",
                ranks_per_node);
  PlanTarget t;
  const TargetConfig& tc = cfg.target;
  t.headroom = tc.headroom;
  t.gpus_per_node = static_cast<int>(tc.gpus_per_node > 0 ? tc.gpus_per_node : ranks_per_node);
  t.nodes = static_cast<int>(tc.nodes > 0 ? tc.nodes : (world_size + ranks_per_node - 1) / ranks_per_node);
  // Query the device only when the keys leave the GPU open (a login node has none).
  const bool need_device = cfg.train.device == DeviceKind::Auto
                               ? tc.gpu.empty() && tc.gpu_memory_gib <= 0
                               : cfg.train.device == DeviceKind::Cuda && tc.gpu.empty();
  const DeviceInfo dev = need_device ? query_device() : DeviceInfo{};
  t.backend = plan_backend(cfg, dev);
  // The CPU backend runs this very program: its footprint is the process baseline.
  if (t.backend == DeviceKind::Cpu) t.process_bytes = std::max<int64_t>(0, vm_rss_bytes());
  if (t.backend == DeviceKind::Cuda) resolve_gpu(cfg, dev, false, t);
  if (t.backend == DeviceKind::Cuda && t.gpu_source != "visible device" && tc.host_memory_gib <= 0) {
    // Planning for GPUs elsewhere: this (login) machine's memory says nothing about their nodes.
    const GpuModel* known = nullptr;
    for (const GpuModel& g : known_gpus())
      if (g.name == t.gpu_name) known = &g;
    if (!known) {  // a GPU given by its memory only: no default; say where the number came from
      t.host_memory_bytes = host_memory_total();
      t.host_source =
          "/proc/meminfo of this machine, not a node of GPU '" + t.gpu_name + "': set target.host_memory_gib";
      return t;
    }
    t.host_memory_bytes = known->host_bytes_per_gpu * t.gpus_per_node;
    t.host_source = "default for " + std::string(known->name) +
                    " nodes: " + std::to_string(known->host_bytes_per_gpu / (1024 * kMiB)) +
                    " GiB per GPU as in NVIDIA's DGX; set target.host_memory_gib for yours";
    return t;
  }
  t.host_memory_bytes = host_memory(cfg, true, t.host_source);
  return t;
}

PlanTarget run_target(const StageConfig& cfg, int world_size, int ranks_per_node) {
  EASYCTX_CHECK(world_size >= 1 && ranks_per_node >= 1, "run_target: world ", world_size, ", ranks per node ",
                ranks_per_node);
  PlanTarget t;
  t.headroom = cfg.target.headroom;
  t.gpus_per_node = ranks_per_node;
  t.nodes = (world_size + ranks_per_node - 1) / ranks_per_node;
  const DeviceInfo dev = cfg.train.device == DeviceKind::Cpu ? DeviceInfo{} : query_device();
  t.backend =
      cfg.train.device == DeviceKind::Auto ? (dev.visible ? DeviceKind::Cuda : DeviceKind::Cpu) : cfg.train.device;
  if (t.backend == DeviceKind::Cuda) resolve_gpu(cfg, dev, true, t);
  t.host_memory_bytes = host_memory(cfg, false, t.host_source);
  t.process_bytes = std::max<int64_t>(0, vm_rss_bytes());  // the running program, before it allocates
  return t;
}

LayoutWorld print_config_world(const StageConfig& cfg, int launch_world, int launch_ranks_per_node) {
  LayoutWorld w;
  const TargetConfig& tc = cfg.target;
  const int sp = static_cast<int>(std::max<int64_t>(1, cfg.parallel.sequence.size));
  if (tc.nodes > 0 && tc.gpus_per_node > 0) {
    w.ranks_per_node = static_cast<int>(tc.gpus_per_node);
    w.world = static_cast<int>(tc.nodes) * w.ranks_per_node;
    w.note = "target.nodes x target.gpus_per_node";
  } else if (launch_world > 1 || sp == 1) {
    w.world = launch_world;
    w.ranks_per_node = std::max(1, launch_ranks_per_node);
    w.note = "this launch";
  } else {
    w.world = sp;
    w.ranks_per_node = sp;
    w.note = "the smallest world for parallel.sequence.size = " + std::to_string(sp) +
             "; launch with mpirun, or set target.nodes and target.gpus_per_node, for another";
  }
  return w;
}

int64_t host_memory_total() {
  const int64_t b = proc_kb("/proc/meminfo", "MemTotal");
  EASYCTX_CHECK(b > 0, "memory plan: cannot read MemTotal from /proc/meminfo; set target.host_memory_gib");
  return b;
}

int64_t vm_hwm_bytes() { return proc_kb("/proc/self/status", "VmHWM"); }
int64_t vm_rss_bytes() { return proc_kb("/proc/self/status", "VmRSS"); }

bool is_hopper_gpu(const std::string& gpu_name) {
  for (const char* h : {"H100", "H200", "H800", "H20"})
    if (gpu_name.find(h) != std::string::npos) return true;
  return false;
}

}  // namespace easyctx::plan
