#include "ops/backend_factory.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "ops/profile.h"
#ifdef EASYCTX_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#include "ops/cuda/cuda_backend.h"
#endif

namespace easyctx::ops {

int visible_cuda_devices() {
#ifdef EASYCTX_HAVE_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

bool cuda_backend_built() {
#ifdef EASYCTX_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

DeviceKind resolve_device(DeviceKind requested, const std::string& key) {
  switch (requested) {
    case DeviceKind::Cpu: return DeviceKind::Cpu;
    case DeviceKind::Cuda:
#ifndef EASYCTX_HAVE_CUDA
      EASYCTX_THROW_INPUT(key,
                          ": cuda: this build has no CUDA backend (rebuild with -DEASYCTX_CUDA=ON); use cpu or "
                          "auto");
#endif
      EASYCTX_CHECK_INPUT(visible_cuda_devices() > 0, key, ": cuda: no CUDA device is visible; use cpu or auto");
      return DeviceKind::Cuda;
    case DeviceKind::Auto: return visible_cuda_devices() > 0 ? DeviceKind::Cuda : DeviceKind::Cpu;
  }
  return DeviceKind::Cpu;
}

std::unique_ptr<Backend> make_backend(DeviceKind device, const BackendOptions& o) {
  EASYCTX_CHECK(device != DeviceKind::Auto, "make_backend: resolve the device first (resolve_device)");
  std::unique_ptr<Backend> be;
  if (device == DeviceKind::Cuda) {
#ifdef EASYCTX_HAVE_CUDA
    CudaBackendOptions co;
    co.deterministic = o.deterministic;
    co.sm90_attention = o.hopper_attention;
    be = make_cuda_backend(co);
#else
    EASYCTX_THROW_INPUT("train.device: cuda: this build has no CUDA backend (rebuild with -DEASYCTX_CUDA=ON)");
#endif
  } else {
    be = make_cpu_backend();
  }
  if (o.profile) be = std::make_unique<ProfilingBackend>(std::move(be));
  return be;
}

DeviceInfo device_info(Backend& be) {
  DeviceInfo info;
  if (be.memspace() != MemSpace::Device) return info;
#ifdef EASYCTX_HAVE_CUDA
  int dev = 0;
  EASYCTX_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  EASYCTX_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  info.name = prop.name;
  if (const char* env = std::getenv("EASYCTX_PEAK_TFLOPS")) info.peak_flops = std::atof(env) * 1e12;
  else if (std::strstr(prop.name, "H100") || std::strstr(prop.name, "H200")) info.peak_flops = 989e12;
  else if (std::strstr(prop.name, "A100")) info.peak_flops = 312e12;
#endif
  return info;
}

double device_memory_used(Backend& be) {
  if (be.memspace() != MemSpace::Device) return -1;
#ifdef EASYCTX_HAVE_CUDA
  size_t free_b = 0, total_b = 0;
  EASYCTX_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<double>(total_b - free_b);
#else
  return -1;
#endif
}

}  // namespace easyctx::ops
