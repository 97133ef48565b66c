// Hopper (sm_90a) attention forward: a FlashAttention-3-style kernel (TMA loads into a shared
// memory ring, wgmma tensor-core GEMMs, a producer warpgroup and two consumer warpgroups).
// Same parameters, layouts and visibility rule as kernels/attention.h (AttentionParams):
//   q, o [B, Sq, Hq, hd] (strides q_batch, q_row), k, v [B, Sk, Hkv, hd] (strides k_batch,
//   k_row), lse f32[B, Hq, Sq] (natural log), key j visible to query i iff !causal or
//   j <= i + diag; rows that see no key get o = 0, lse = -inf.
// Compiled only for sm_90a (its own static library, easyctx_kernels_sm90): on any other device
// attention_fwd_sm90_supported() is false and attention_fwd_sm90() throws.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/attention.h"

namespace easyctx::kernels {

// True when the current device is sm_90 (H100/H200), the one the sm_90a code runs on.
bool sm90_device_available();

// True when attention_fwd_sm90 can run `p` on the current device: sm_90, hd 64 or 128, Sq and Sk
// in [1, 2^30], 16-byte aligned q/k/v/o, row and batch strides multiples of 8 elements (TMA's
// 16-byte global strides), lse_out and o_out set. `why` (optional) gets the first reason not.
bool attention_fwd_sm90_supported(const AttentionParams& p, std::string* why = nullptr);

// Consumer schedules (same results up to fp32 summation order, both tested):
//   Overlap: the softmax of key tile n runs while the tensor cores do P_{n-1} V_{n-1} (FA3's
//            intra-warpgroup overlap), the default;
//   Simple:  one tile at a time (S GEMM, wait, softmax, P V GEMM, wait): the reference schedule;
//   PingPong: Overlap plus the two consumer warpgroups taking turns to issue their GEMMs (named
//            barriers), so one's softmax hides behind the other's GEMMs.
enum class Sm90FwdVariant { Overlap, Simple, PingPong };
const char* sm90_fwd_variant_name(Sm90FwdVariant v);

// o_out, lse_out = attention(q, k, v) forward on `st`. Throws when !supported(p).
void attention_fwd_sm90(const AttentionParams& p, cudaStream_t st, Sm90FwdVariant variant = Sm90FwdVariant::Overlap);

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
void sm90_wgmma_tile_check(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int hd,
                           float* s_out, float* o_out, cudaStream_t st, bool swap_v_offsets = false);

}  // namespace easyctx::kernels
