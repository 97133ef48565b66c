// Shared by the CUDA backend's files (cuda_backend.cpp, cuda_attention.cpp): stream-ordered
// scratch, the checks of device tensors, the dispatch on f32/bf16. Internal to lib/ops/cuda.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda_check.h"
#include "kernels/kernels.h"
#include "ops/memory_counter.h"
#include "ops/tensor.h"

namespace easyctx::ops::cuda {

using kernels::bf16;

// Stream-ordered scratch buffer (RAII): freed on the stream when it goes out of scope.
// Counted in the backend's live bytes while it exists, so the peak covers Buffers and
// scratch together (the same stream reuses the memory only after the free, in order).
// Sized by the scratch functions of ops/scratch.h and ops/attention_route.h.
class Scratch {
 public:
  Scratch(size_t bytes, cudaStream_t st, MemoryCounter& mem) : st_(st), mem_(mem) {
    if (!bytes) return;
    EASYCTX_CUDA_CHECK(cudaMallocAsync(&p_, bytes, st));
    bytes_ = static_cast<int64_t>(bytes);
    mem_.add(bytes_);
  }
  Scratch(int64_t bytes, cudaStream_t st, MemoryCounter& mem) : Scratch(static_cast<size_t>(bytes), st, mem) {}
  ~Scratch() {
    if (!p_) return;
    cudaFreeAsync(p_, st_);  // a destructor cannot throw; a failed free leaks the block
    mem_.sub(bytes_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  int64_t bytes_ = 0;
  cudaStream_t st_;
  MemoryCounter& mem_;
};

inline void check_device(const char* op, const Tensor& t) {
  EASYCTX_CHECK(t.space == MemSpace::Device, op, ": the CUDA backend needs device memory, got a host tensor ",
                t.describe());
}
inline void check_float(const char* op, const Tensor& t) {
  check_device(op, t);
  EASYCTX_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, op, ": the CUDA backend stores f32 or bf16, got ",
                t.describe());
}
inline void check_type(const char* op, const char* name, const Tensor& t, DType want) {
  check_device(op, t);
  EASYCTX_CHECK(t.dtype == want, op, ": ", name, " must be ", type_name(want), ", got ", t.describe());
}

// Calls f with a typed null pointer (float* or bf16*) chosen by the dtype.
template <typename F>
void dispatch(DType t, F&& f) {
  if (t == DType::F32) f(static_cast<float*>(nullptr));
  else f(static_cast<bf16*>(nullptr));
}
template <typename T>
T* typed(const Tensor& t) {
  return static_cast<T*>(t.data);
}

}  // namespace easyctx::ops::cuda
