// Hopper (sm_90a) attention forward: a FlashAttention-3-style kernel (TMA loads into a shared
// memory ring, wgmma tensor-core GEMMs, a producer warpgroup and two consumer warpgroups, three
// at head dim 64).
// Same parameters, layouts and visibility rule as kernels/attention.h (AttentionParams):
//   q, o [B, Sq, Hq, hd] (strides q_batch, q_row), k, v [B, Sk, Hkv, hd] (strides k_batch,
//   k_row), lse f32[B, Hq, Sq] (natural log), key j visible to query i iff !causal or
//   j <= i + diag, and with a sliding window (p.window > 0) j > i + diag - window; rows that see
//   no key get o = 0, lse = -inf.
// Compiled only for sm_90a (its own static library, easyctx_kernels_sm90): on any other device
// attention_fwd_sm90_supported() is false and attention_fwd_sm90() throws.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_sm90_variants.h"  // the variants and which one a call takes

namespace easyctx::kernels {

// True when the current device is sm_90 (H100/H200), the one the sm_90a code runs on.
bool sm90_device_available();

// True when attention_fwd_sm90 can run `p` on the current device: sm_90, hd 64 or 128, Sq and Sk
// in [1, 2^30], 16-byte aligned q/k/v/o, row and batch strides multiples of 8 elements (TMA's
// 16-byte global strides), lse_out and o_out set. `why` (optional) gets the first reason not.
bool attention_fwd_sm90_supported(const AttentionParams& p, std::string* why = nullptr);

// o_out, lse_out = attention(q, k, v) forward on `st` (Auto: sm90_fwd_variant_for(p.hd)).
// Throws when !supported(p) or the variant does not support p.hd.
void attention_fwd_sm90(const AttentionParams& p, cudaStream_t st, Sm90FwdVariant variant = Sm90FwdVariant::Auto);

// Test hook: the K + V bytes per L2 section of the persistent variant's work list (0, the
// default: 32 MiB), so small shapes can reach several sections, a partial last one included.
void sm90_set_l2_section_bytes(int64_t bytes);

// "" normally; after a kernel of this file gave up on an mbarrier wait (a hang: see
// mbar_wait in attention_fwd_sm90.cu; its results are then garbage), where it happened. Resets
// the record. Call after synchronizing the stream.
std::string sm90_take_hang_report();

// Self-test of the layer under the attention kernel (TMA tensor maps with 128-byte swizzle,
// wgmma shared-memory descriptors, the fp32 accumulator fragment and the register-A fragment),
// one warpgroup on one tile:
//   s_out[64 x 128] = q[64 x hd] k[128 x hd]^T                 (fp32, the Q K^T GEMM, both K-major)
//   o_out[64 x hd]  = bf16(s_out) v[128 x hd]                   (fp32, the P V GEMM, P from registers)
// q, k, v row-major with rows of hd elements (hd 64 or 128). If s_out is wrong, the K-major
// descriptors / TMA / accumulator layout are at fault; if only o_out is, the MN-major (V)
// descriptor or the accumulator -> A-fragment conversion is. swap_v_offsets (a diagnostic,
// never what the attention kernel does) exchanges the V descriptor's leading and stride byte
// offsets: if that o_out is right instead, the kernel's reading of LBO/SBO is the bug.
void sm90_wgmma_tile_check(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int hd, float* s_out,
                           float* o_out, cudaStream_t st, bool swap_v_offsets = false);

// ------------------------------------------------------------------ backward (attention_bwd_sm90.cu)
// dq += , dk += , dv += the gradients of this block (bf16, the contract of attention_bwd in
// kernels/attention.h: q, k, v, o (the forward's output), dout, lse (natural log, -inf for rows
// that see no key), scale, causal / diag as the forward). p.delta is NOT used: delta lives in
// `scratch` with the other temporaries. FlashAttention-3-style: a CTA per (128 keys, kv head,
// batch) loops over the query heads of its GQA group and their 64-row (hd 64 split: 128-row)
// tiles that see its keys (TMA + wgmma, a producer and two consumer warpgroups); dQ goes through
// an fp32 accumulator in scratch. Variants: Sm90BwdVariant (kernels/attention_sm90_variants.h).

// Bytes of device scratch attention_bwd_sm90 needs for `p` (only batch, hq, sq, hd matter; the
// layout: kernels/attention_sm90_scratch.h). 0 when p is malformed.
int64_t attention_bwd_sm90_scratch_bytes(const AttentionParams& p);

// As attention_fwd_sm90_supported, for the backward: also o, dout, dq, dk, dv set and 16-byte
// aligned (same strides as q / k).
bool attention_bwd_sm90_supported(const AttentionParams& p, std::string* why = nullptr);

// The backward on `st`. scratch: attention_bwd_sm90_scratch_bytes(p) bytes of device memory,
// 256-byte aligned, owned by the caller (contents need not be initialised; in use until the
// stream passes the call). Throws when !supported(p) or scratch is null / misaligned.
void attention_bwd_sm90(const AttentionParams& p, void* scratch, cudaStream_t st, Sm90BwdVariant variant);

// "" normally; after a wait of the backward kernel gave up (an mbarrier or a deterministic dQ
// semaphore that never completed: a protocol bug; results then garbage), where. Resets it.
std::string sm90_bwd_take_hang_report();

// Self-test of the GEMM shapes / layouts the backward adds (two warpgroups, keys 64w.. each),
// on k [128 x hd] and q [64 x hd] row-major (hd 64 or 128), all outputs fp32 row-major:
//   st_out[128 x 64] = k q^T                 (m64n64k16, both operands K-major from shared memory)
//   dk_out[128 x hd] = bf16(st_out) q        (the accumulator as register A, q MN-major, 64-row tile)
//   dq_out[64 x hd]  = bf16(st_out)^T k      (A = bf16(st)^T written to swizzled shared memory by
//                                             the threads, both operands MN-major: trans-a, trans-b)
// If st_out is wrong: the m64n64 K-major path; dk_out alone: the 64-row MN-major B descriptor
// (LBO 8 KiB); dq_out alone: the swizzled store of dS^T, the proxy fence or the trans-a path.
void sm90_bwd_tile_check(const __nv_bfloat16* q, const __nv_bfloat16* k, int hd, float* st_out, float* dk_out,
                         float* dq_out, cudaStream_t st);

}  // namespace easyctx::kernels
