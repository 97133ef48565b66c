// Token embedding.
//   fwd: out[n, D] = table[ids[n], D]        bytes: 2 n D sizeof(T) + 4n, no FLOPs
//   bwd: dtable[ids[i]] += dout[i]           bytes: ~3 n D sizeof(T) + sort of n ids
// The backward is deterministic without atomics: the ids are radix-sorted stably with their
// row numbers (cub), then one block per run of equal ids adds that run's rows in their
// original order to the table row it owns.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace easyctx::kernels {
namespace {

template <typename T>
__global__ void embedding_fwd_kernel(const int32_t* ids, int64_t n, const T* table, int64_t vocab, int64_t d, T* out,
                                     int* bad_id) {
  const int64_t i = blockIdx.x;
  const int32_t id = ids[i];
  T* o = out + i * d;
  if (id < 0 || id >= vocab) {                    // flag it and write zeros so nothing reads garbage
    if (threadIdx.x == 0) atomicExch(bad_id, 1);  // a flag, not a reduction: order is irrelevant
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) o[c] = from_float<T>(0.f);
    return;
  }
  const T* src = table + static_cast<int64_t>(id) * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) o[c] = src[c];
}

// One block per sorted position; only the first position of a run of equal ids works.
template <typename T>
__global__ void embedding_bwd_kernel(const int32_t* sorted, const int32_t* order, int64_t n, const T* dout,
                                     int64_t vocab, int64_t d, T* dtable) {
  const int64_t p = blockIdx.x;
  const int32_t id = sorted[p];
  if ((p > 0 && sorted[p - 1] == id) || id < 0 || id >= vocab) return;
  int64_t end = p + 1;
  while (end < n && sorted[end] == id) ++end;
  T* dst = dtable + static_cast<int64_t>(id) * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = to_float(dst[c]);
    for (int64_t q = p; q < end; ++q) acc += to_float(dout[static_cast<int64_t>(order[q]) * d + c]);
    dst[c] = from_float<T>(acc);
  }
}

__global__ void iota_kernel(int32_t* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = static_cast<int32_t>(i);
}

}  // namespace

template <typename T>
void embedding_fwd(const int32_t* ids, int64_t n, const T* table, int64_t vocab, int64_t d, T* out, int* bad_id,
                   cudaStream_t st) {
  if (n == 0) return;
  embedding_fwd_kernel<<<static_cast<unsigned>(n), 256, 0, st>>>(ids, n, table, vocab, d, out, bad_id);
  EASYCTX_CUDA_CHECK_LAUNCH("embedding_fwd_kernel");
}

void sort_ids(const int32_t* ids, int32_t* sorted_ids, int32_t* iota_in, int32_t* order, int64_t n, void* temp,
              size_t* temp_bytes, int end_bit, cudaStream_t st) {
  if (temp == nullptr) {
    EASYCTX_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, *temp_bytes, ids, sorted_ids, iota_in, order,
                                                       static_cast<int>(n), 0, end_bit, st));
    return;
  }
  iota_kernel<<<elementwise_grid(n, 256), 256, 0, st>>>(iota_in, n);
  EASYCTX_CUDA_CHECK_LAUNCH("iota_kernel");
  EASYCTX_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, *temp_bytes, ids, sorted_ids, iota_in, order,
                                                     static_cast<int>(n), 0, end_bit, st));
}

template <typename T>
void embedding_bwd_sorted(const int32_t* sorted_ids, const int32_t* order, int64_t n, const T* dout, int64_t vocab,
                          int64_t d, T* dtable, cudaStream_t st) {
  if (n == 0) return;
  embedding_bwd_kernel<<<static_cast<unsigned>(n), 256, 0, st>>>(sorted_ids, order, n, dout, vocab, d, dtable);
  EASYCTX_CUDA_CHECK_LAUNCH("embedding_bwd_kernel");
}

template void embedding_fwd<float>(const int32_t*, int64_t, const float*, int64_t, int64_t, float*, int*, cudaStream_t);
template void embedding_fwd<bf16>(const int32_t*, int64_t, const bf16*, int64_t, int64_t, bf16*, int*, cudaStream_t);
template void embedding_bwd_sorted<float>(const int32_t*, const int32_t*, int64_t, const float*, int64_t, int64_t,
                                          float*, cudaStream_t);
template void embedding_bwd_sorted<bf16>(const int32_t*, const int32_t*, int64_t, const bf16*, int64_t, int64_t, bf16*,
                                         cudaStream_t);

}  // namespace easyctx::kernels
