// Launchers of the CUDA kernels (one .cu per op family in this folder). Each launcher takes
// device pointers, 64-bit sizes and an explicit stream, launches with a CEIL_DIV grid and
// checks the launch; it never synchronises. T is float or __nv_bfloat16 (bf16 storage,
// fp32 arithmetic); statistics (rstd, LSE) are always fp32.
// The shapes, bytes and FLOPs of each kernel are in its .cu header and in docs/cuda.md.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/adamw_math.h"
#include "ops/scratch.h"  // the block constants the backends' scratch is sized by

namespace easyctx::kernels {

using bf16 = __nv_bfloat16;

// ---- elementwise.cu
template <typename TD, typename TS>
void convert(TD* dst, const TS* src, int64_t n, cudaStream_t st);  // dst = (TD) src
template <typename T>
void fill(T* x, float value, int64_t n, cudaStream_t st);  // x = value
// y += alpha x in fp32, rounded once to TY; (TY, TX) in (f32, f32), (bf16, bf16), (f32, bf16), (bf16, f32)
template <typename TY, typename TX>
void axpy(TY* y, const TX* x, float alpha, int64_t n, cudaStream_t st);
template <typename T>
void scale(T* x, float alpha, int64_t n, cudaStream_t st);  // x *= alpha
// Sum of squares in fp64, fixed reduction order: partial[kSumSquaresBlocks] then one block
// (ops::sum_squares_scratch).
constexpr int kSumSquaresBlocks = static_cast<int>(ops::kSumSquaresBlocks);
template <typename T>
void sum_squares(const T* x, int64_t n, double* partial, double* out, cudaStream_t st);
// out[0] = sum of x[0..n) in fp64 in a fixed order (one block).
void sum_f64(const double* x, int64_t n, double* out, cudaStream_t st);

// ---- embedding.cu: ids i32[n], table [V, D], out [n, D]
template <typename T>
void embedding_fwd(const int32_t* ids, int64_t n, const T* table, int64_t vocab, int64_t d, T* out, int* bad_id,
                   cudaStream_t st);
// Deterministic backward: the caller passes ids sorted (stably) with their original rows
// (sorted_ids[n], order[n]); one block per run of equal ids sums its rows in order.
template <typename T>
void embedding_bwd_sorted(const int32_t* sorted_ids, const int32_t* order, int64_t n, const T* dout, int64_t vocab,
                          int64_t d, T* dtable, cudaStream_t st);
// Stable radix sort of (ids, 0..n-1): temp storage query when temp == nullptr.
void sort_ids(const int32_t* ids, int32_t* sorted_ids, int32_t* iota_in, int32_t* order, int64_t n, void* temp,
              size_t* temp_bytes, int end_bit, cudaStream_t st);

// ---- rmsnorm.cu: x, y [n, D], w [D], rstd f32[n]
template <typename T>
void rmsnorm_fwd(const T* x, const T* w, int64_t n, int64_t d, float eps, T* y, float* rstd, cudaStream_t st);
// dx += ...; partial_dw f32[ops::rmsnorm_dw_chunks(n), D] gets per-chunk dw sums (fixed
// order; chunks of ops::kRmsnormDwRows rows, ops::rmsnorm_bwd_scratch).
template <typename T>
void rmsnorm_bwd(const T* x, const T* w, const float* rstd, const T* dy, int64_t n, int64_t d, T* dx, float* partial_dw,
                 cudaStream_t st);
// dw[D] += sum over chunks of partial[chunks, D], chunk order fixed.
template <typename T>
void reduce_columns_add(const float* partial, int64_t chunks, int64_t d, T* dw, cudaStream_t st);

// ---- rope.cu: x [n, H, hd] in place, positions i32[n], inv_freq f32[hd/2]
template <typename T>
void rope(T* x, int64_t n, int64_t heads, int64_t hd, const int32_t* pos, const float* inv_freq, bool inverse,
          cudaStream_t st);

// ---- swiglu.cu: g, u, h [n]
template <typename T>
void swiglu_fwd(const T* g, const T* u, int64_t n, T* h, cudaStream_t st);
template <typename T>
void swiglu_bwd(const T* g, const T* u, const T* dh, int64_t n, T* dg, T* du, cudaStream_t st);

// ---- cross_entropy.cu: logits f32[rows, V] of one tile, labels i32[rows] (-1 ignored).
// nll f64[rows] (0 for ignored rows). With grad != nullptr also writes
// grad[rows, V] = grad_scale * (softmax - onehot) (0 rows for ignored labels); grad may
// alias logits when T is float (in place).
template <typename T>
void cross_entropy_tile(const float* logits, const int32_t* labels, int64_t rows, int64_t vocab, float grad_scale,
                        double* nll, T* grad, int* bad_label, cudaStream_t st);
// Scores of one tile (evaluations, Backend::lm_head_score): for rows with a label, nll[r] as
// cross_entropy_tile computes it and top[r] = 1 when the label is the first index of the
// row's largest logit (torch.argmax), else 0; 0 and 0 for label -1; bad labels set the flag.
void score_tile(const float* logits, const int32_t* labels, int64_t rows, int64_t vocab, double* nll, int32_t* top,
                int* bad_label, cudaStream_t st);
// count[0] = number of labels >= 0 (fixed order).
void count_labels(const int32_t* labels, int64_t n, int64_t* count, cudaStream_t st);

// ---- adamw.cu: param, grad, m, v f32[n]; the update of adamw_math.h
void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWConsts& c, cudaStream_t st);

// ---- attention_*.cu: see attention.h for the parameter structs.
// attention_merge: o [B, S, H, hd] (TO), lse f32[B, H, S] updated with o_blk (TB), lse_blk.
// Instantiated for (f32, f32), (bf16, bf16) and (f32, bf16): a ring's fp32 accumulator.
template <typename TO, typename TB>
void attention_merge(TO* o, float* lse, const TB* o_blk, const float* lse_blk, int64_t batch, int64_t sq, int64_t hq,
                     int64_t hd, cudaStream_t st);

}  // namespace easyctx::kernels
