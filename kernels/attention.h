// Parameters and launchers of the FlashAttention-2-style kernels (attention_fwd.cu,
// attention_bwd.cu): bf16 q/k/v/o, fp32 accumulators and LSE, native GQA, head dim 64 or
// 128, causal masking with the block offsets of ops::AttentionBlock.
//
// Layouts (row-major, strides in elements, 64-bit):
//   q, o, dout, dq [B, Sq, Hq, hd]   row i of head h at  q + b*q_batch + i*q_row + h*hd
//   k, v, dk, dv   [B, Sk, Hkv, hd]  row j of head g at  k + b*k_batch + j*k_row + g*hd
//   lse            f32[B, Hq, Sq]    natural log of the softmax denominator of scale*q.k
// Visibility: with causal, key j is visible to query i iff j <= i + diag, where
// diag = q_offset - k_offset; with a sliding window (window > 0, causal or not) also only if
// j > i + diag - window (transformers' kv_idx > q_idx - sliding_window); a row that sees no key
// gets o = 0, lse = -inf. Key tiles wholly before a query tile's window are not loaded.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace easyctx::kernels {

struct AttentionParams {
  const __nv_bfloat16* q = nullptr;
  const __nv_bfloat16* k = nullptr;
  const __nv_bfloat16* v = nullptr;
  const __nv_bfloat16* o = nullptr;     // bwd: the final output of the rows
  const __nv_bfloat16* dout = nullptr;  // bwd
  const float* lse = nullptr;           // bwd: the final LSE of the rows
  __nv_bfloat16* o_out = nullptr;       // fwd output
  float* lse_out = nullptr;             // fwd output
  __nv_bfloat16* dq = nullptr;          // bwd, accumulated (+=)
  __nv_bfloat16* dk = nullptr;          // bwd, accumulated (+=)
  __nv_bfloat16* dv = nullptr;          // bwd, accumulated (+=)
  float* delta = nullptr;               // bwd scratch f32[B, Hq, Sq]: rowsum(dout * o)
  int64_t batch = 0, sq = 0, sk = 0, hq = 0, hkv = 0, hd = 0;
  int64_t q_batch = 0, q_row = 0, k_batch = 0, k_row = 0;
  float scale = 0;       // softmax scale
  float scale_log2 = 0;  // scale * log2(e): the kernels work in base 2
  bool causal = true;
  int64_t diag = 0;    // q_offset - k_offset
  int64_t window = 0;  // sliding window (ops::AttentionBlock::window); 0: none
};

// o_out, lse_out = attention(q, k, v). Throws for head dims other than 64 and 128.
void attention_fwd(const AttentionParams& p, cudaStream_t st);
// dq += , dk += , dv += the gradients of this block (uses p.delta as scratch).
void attention_bwd(const AttentionParams& p, cudaStream_t st);

}  // namespace easyctx::kernels
