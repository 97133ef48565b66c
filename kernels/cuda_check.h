// Error checks for CUDA runtime calls and kernel launches, shared by kernels/*.cu and the
// CUDA backend (lib/ops/cuda). Failures throw easyctx::Error with the call, the file:line
// and the process label ("host:rank"), never exit(): the app decides how to stop.
#pragma once
#include <cuda_runtime.h>

#include "core/error.h"

#define CEIL_DIV(a, b) (((a) + (b)-1) / (b))

#define EASYCTX_CUDA_CHECK(call)                                                                        \
  do {                                                                                                  \
    cudaError_t easyctx_err_ = (call);                                                                  \
    if (easyctx_err_ != cudaSuccess)                                                                    \
      EASYCTX_THROW(::easyctx::process_label(), " CUDA error ", cudaGetErrorName(easyctx_err_), " (",   \
                    cudaGetErrorString(easyctx_err_), ") in ", #call, " at ", __FILE__, ":", __LINE__); \
  } while (0)

// After a launch: configuration errors show up here (asynchronous faults at the next sync).
#define EASYCTX_CUDA_CHECK_LAUNCH(what) EASYCTX_CUDA_CHECK_MSG(cudaGetLastError(), what)

#define EASYCTX_CUDA_CHECK_MSG(call, what)                                                             \
  do {                                                                                                 \
    cudaError_t easyctx_err_ = (call);                                                                 \
    if (easyctx_err_ != cudaSuccess)                                                                   \
      EASYCTX_THROW(::easyctx::process_label(), " CUDA error ", cudaGetErrorName(easyctx_err_), " (",  \
                    cudaGetErrorString(easyctx_err_), ") in ", what, " at ", __FILE__, ":", __LINE__); \
  } while (0)
