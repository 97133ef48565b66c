// Which backend a program runs on, and the facts about its device that reports need. Every
// program that computes (easyctx_train, easyctx_eval_ppl, the benchmarks) gets its backend
// here, so `cpu`, `cuda` and `auto` mean the same everywhere.
#pragma once
#include <memory>
#include <string>

#include "core/config.h"
#include "ops/ops.h"

namespace easyctx::ops {

struct BackendOptions {
  bool deterministic = true;     // train.deterministic (CUDA: a fixed-order attention backward)
  bool profile = false;          // logging.profile: wrapped in ops::ProfilingBackend
  bool hopper_attention = true;  // train.hopper_attention (CUDA on sm_90: the Hopper attention kernels)
};

// The device for a requested kind (`key` names the setting in messages, e.g. "train.device"):
// cpu -> cpu; cuda -> cuda (refused, naming the key, when the build has no CUDA or no device
// is visible); auto -> cuda when the build has CUDA and a device is visible, else cpu.
DeviceKind resolve_device(DeviceKind requested, const std::string& key = "train.device");

// The backend of a resolved device (cpu or cuda).
std::unique_ptr<Backend> make_backend(DeviceKind device, const BackendOptions& o = {});

// A CUDA device's name and dense bf16 peak in FLOP/s by its name (H100/H200 989e12, A100
// 312e12; EASYCTX_PEAK_TFLOPS overrides; 0: unknown). The CPU backend: "cpu", 0.
struct DeviceInfo {
  std::string name = "cpu";
  double peak_flops = 0;
};
DeviceInfo device_info(Backend& be);

// Device memory in use (everything on the device, cudaMemGetInfo), bytes; -1 on the CPU.
double device_memory_used(Backend& be);

// Number of visible CUDA devices (0 without CUDA, a driver or a device; never an error).
int visible_cuda_devices();

// Whether this build has the CUDA backend (configured with the CUDA toolkit, cuDNN and NCCL).
bool cuda_backend_built();

}  // namespace easyctx::ops
