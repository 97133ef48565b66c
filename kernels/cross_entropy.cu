// Cross entropy on one tile of fp32 logits (the LM head GEMM writes them, tiled along the
// tokens so the full [n, V] never exists): logits f32[rows, V], labels i32[rows].
//   nll[r] = logsumexp(logits[r]) - logits[r, label]        (fp64 out, 0 for label -1)
//   grad[r] = grad_scale * (softmax(logits[r]) - onehot)     (optional, may alias logits)
// One block per row, three passes over the row (max, sum of exp, softmax):
//   bytes: rows V (3*4 + sizeof(T)); FLOPs ~5 rows V + rows V exp
#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace easyctx::kernels {
namespace {

template <typename T>
__global__ void cross_entropy_kernel(const float* logits, const int32_t* labels, int64_t vocab, float grad_scale,
                                     double* nll, T* grad, int* bad_label) {
  const int64_t row = blockIdx.x;
  const float* lr = logits + row * vocab;
  const int32_t lab = labels[row];
  if (lab < 0 || lab >= vocab) {
    if (threadIdx.x == 0) {
      nll[row] = 0;
      if (lab < -1 || lab >= vocab) atomicExch(bad_label, 1);  // a flag, order irrelevant
    }
    if (grad)
      for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) grad[row * vocab + j] = from_float<T>(0.f);
    return;
  }
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, lr[j]);
  mx = block_max(mx);
  float sum = 0;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += expf(lr[j] - mx);
  sum = block_sum(sum);
  const float lse = mx + logf(sum);
  const float target = lr[lab];
  __syncthreads();  // every thread has read lr[lab] before an aliasing grad overwrites it
  if (threadIdx.x == 0) nll[row] = static_cast<double>(lse) - static_cast<double>(target);
  if (grad) {
    T* gr = grad + row * vocab;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      float g = grad_scale * expf(lr[j] - lse);
      if (j == lab) g -= grad_scale;
      gr[j] = from_float<T>(g);
    }
  }
}

// One block per row: the same max / sum of exp / lse as cross_entropy_kernel (so the NLL is
// the same bits), plus the argmax: the smallest index holding the row's maximum.
__global__ void score_kernel(const float* logits, const int32_t* labels, int64_t vocab, double* nll, int32_t* top,
                             int* bad_label) {
  const int64_t row = blockIdx.x;
  const float* lr = logits + row * vocab;
  const int32_t lab = labels[row];
  if (lab < 0 || lab >= vocab) {
    if (threadIdx.x == 0) {
      nll[row] = 0;
      top[row] = 0;
      if (lab < -1 || lab >= vocab) atomicExch(bad_label, 1);
    }
    return;
  }
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, lr[j]);
  mx = block_max(mx);
  float sum = 0;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += expf(lr[j] - mx);
  sum = block_sum(sum);
  // The first index holding the maximum: each thread's first hit, then the block's minimum.
  long long first = vocab;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
    if (lr[j] == mx) {
      first = j;
      break;
    }
  __shared__ long long part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
  if (lane == 0) part[warp] = first;
  __syncthreads();
  if (threadIdx.x == 0) {
    long long best = part[0];
    for (int w = 1; w < nw; ++w) best = min(best, part[w]);
    const float lse = mx + logf(sum);
    nll[row] = static_cast<double>(lse) - static_cast<double>(lr[lab]);
    top[row] = best == lab ? 1 : 0;
  }
}

__global__ void count_labels_kernel(const int32_t* labels, int64_t n, int64_t* count) {
  float c = 0;  // exact: per-thread counts stay far below 2^24
  double total = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) c += labels[i] >= 0 ? 1.f : 0.f;
  total = block_sum(static_cast<double>(c));
  if (threadIdx.x == 0) count[0] = static_cast<int64_t>(total);
}

}  // namespace

template <typename T>
void cross_entropy_tile(const float* logits, const int32_t* labels, int64_t rows, int64_t vocab, float grad_scale,
                        double* nll, T* grad, int* bad_label, cudaStream_t st) {
  if (rows == 0) return;
  cross_entropy_kernel<T>
      <<<static_cast<unsigned>(rows), 512, 0, st>>>(logits, labels, vocab, grad_scale, nll, grad, bad_label);
  EASYCTX_CUDA_CHECK_LAUNCH("cross_entropy_kernel");
}

void score_tile(const float* logits, const int32_t* labels, int64_t rows, int64_t vocab, double* nll, int32_t* top,
                int* bad_label, cudaStream_t st) {
  if (rows == 0) return;
  score_kernel<<<static_cast<unsigned>(rows), 512, 0, st>>>(logits, labels, vocab, nll, top, bad_label);
  EASYCTX_CUDA_CHECK_LAUNCH("score_kernel");
}

void count_labels(const int32_t* labels, int64_t n, int64_t* count, cudaStream_t st) {
  count_labels_kernel<<<1, 1024, 0, st>>>(labels, n, count);
  EASYCTX_CUDA_CHECK_LAUNCH("count_labels_kernel");
}

template void cross_entropy_tile<float>(const float*, const int32_t*, int64_t, int64_t, float, double*, float*, int*,
                                        cudaStream_t);
template void cross_entropy_tile<bf16>(const float*, const int32_t*, int64_t, int64_t, float, double*, bf16*, int*,
                                       cudaStream_t);

}  // namespace easyctx::kernels
