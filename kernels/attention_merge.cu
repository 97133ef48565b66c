// Merge of one attention block into the running result (ring attention's combine step):
//   lse = max + log1p(exp(min - max)),  o = o e^(lse_old - lse) + o_blk e^(lse_blk - lse)
// o [B, S, H, hd] (TO: f32 for a ring's fp32 accumulator, or the data type), o_blk (TB),
// lse, lse_blk f32[B, H, S]; a block row with lse_blk = -inf
// (it saw no key) leaves the row unchanged. One warp per (b, s, h) row, fp32 math.
//   bytes: 3 B S H hd sizeof(T) + 12 B H S; ~3 B S H hd FLOPs
#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace easyctx::kernels {
namespace {

template <typename TO, typename TB>
__global__ void attention_merge_kernel(TO* o, float* lse, const TB* o_blk, const float* lse_blk, int64_t batch,
                                       int64_t sq, int64_t hq, int64_t hd) {
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;  // (b, i, h) in o's order
  const int lane = threadIdx.x & 31;
  if (row >= batch * sq * hq) return;
  const int64_t b = row / (sq * hq), i = (row / hq) % sq, h = row % hq;
  const int64_t li = (b * hq + h) * sq + i;
  const float la = lse[li], lb = lse_blk[li];
  if (isinf(lb) && lb < 0) return;
  const float mx = fmaxf(la, lb), mn = fminf(la, lb);
  const float nl = (isinf(mn) && mn < 0) ? mx : mx + log1pf(expf(mn - mx));
  const float wa = expf(la - nl), wb = expf(lb - nl);
  TO* orow = o + row * hd;
  const TB* brow = o_blk + row * hd;
  for (int64_t c = lane; c < hd; c += 32) orow[c] = from_float<TO>(to_float(orow[c]) * wa + to_float(brow[c]) * wb);
  if (lane == 0) lse[li] = nl;
}

}  // namespace

template <typename TO, typename TB>
void attention_merge(TO* o, float* lse, const TB* o_blk, const float* lse_blk, int64_t batch, int64_t sq, int64_t hq,
                     int64_t hd, cudaStream_t st) {
  const int64_t threads = batch * sq * hq * 32;
  if (threads == 0) return;
  attention_merge_kernel<<<static_cast<unsigned>(CEIL_DIV(threads, 256)), 256, 0, st>>>(o, lse, o_blk, lse_blk, batch,
                                                                                        sq, hq, hd);
  EASYCTX_CUDA_CHECK_LAUNCH("attention_merge_kernel");
}

template void attention_merge<float, float>(float*, float*, const float*, const float*, int64_t, int64_t, int64_t,
                                            int64_t, cudaStream_t);
template void attention_merge<bf16, bf16>(bf16*, float*, const bf16*, const float*, int64_t, int64_t, int64_t, int64_t,
                                          cudaStream_t);
template void attention_merge<float, bf16>(float*, float*, const bf16*, const float*, int64_t, int64_t, int64_t,
                                           int64_t, cudaStream_t);

}  // namespace easyctx::kernels
