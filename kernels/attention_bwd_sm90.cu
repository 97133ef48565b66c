// Hopper attention backward (sm_90a only): FlashAttention-3's backward structure, raw PTX, on
// the building blocks of the forward (kernels/sm90_common.cuh: mbarriers with the hang report,
// TMA tensor maps with 128-byte swizzle, wgmma descriptors; kernels/wgmma_sm90.cuh).
//
// What it does (contract of kernels/attention.h / attention_bwd.cu): given q, k, v, the forward's
// o and lse (natural log, -inf for rows that see no key) and dout, it ADDS the gradients to
// dq, dk, dv (bf16, +=), with dS = P (dP - delta), delta = rowsum(dout * o):
//   dV += P^T dO,  dK += scale dS^T Q,  dQ += scale dS K.
// GQA: dK/dV of kv head g sum over the query heads of its group; causal with diag offset; a
// sliding window (a CTA steps over the query tiles whose windows reach its keys); ragged Sq/Sk;
// head dims 64 and 128.
//
// Three kernels:
//   1. prep: per (b, h, row) of the row-padded range [0, Sq_pad) (Sq_pad = Sq rounded up to 64):
//      delta = rowsum(dout * o) (0 past Sq), lse2 = lse * log2(e) (+inf past Sq and for lse =
//      -inf, so exp2(s - lse2) = 0: such rows contribute nothing), dq_acc row = 0, and the
//      deterministic variant's semaphores = 0.
//   2. main: one CTA per (128-key block n, kv head g, batch b): a producer warpgroup (one thread
//      issuing TMA) and two consumer warpgroups, consumer cw owning keys 64cw .. 64cw+63 of the
//      block (the wgmma M dimension is the keys: FA3's "SdP_swapAB", so P^T and dS^T come out of
//      the accumulators already as the register A operand of the dV / dK GEMMs). K and V of the
//      block are loaded once; then for each query head h of the group and each 64-row query
//      tile m that can see the block, the producer loads Q, dO (TMA, 2-stage ring) and lse2,
//      delta (cp.async.bulk) and each consumer does
//        S^T  = K_cw Q^T        [64 keys x 64 q]   wgmma ss, both K-major   (m64n64k16)
//        dP^T = V_cw dO^T       [64 x 64]          wgmma ss, both K-major   (m64n64k16)
//        P^T  = exp2(S^T scale_log2 - lse2), masked to 0; dS^T = P^T (dP^T - delta)
//        dV  += P^T dO          [64 keys x hd]     wgmma rs (P^T from registers, dO MN-major)
//        dK  += dS^T Q          [64 keys x hd]     wgmma rs (dS^T from registers, Q MN-major)
//        dS^T -> shared memory (bf16, 128-byte swizzled [128 keys][64 q])
//      and then dQ, split between the consumers (template DqSplit; no partials to sum):
//        columns (hd 128, FA3's): dQ[:, dims 64cw..] = dS K[:, dims 64cw..]  [64 q x 64], over all
//                               128 keys, after a barrier of both consumers (dS^T double
//                               buffered), wgmma ss, both MN-major (trans-a, trans-b);
//        rows (hd 64's split):  steps of 128 query rows (FA3's hd 64 tiles: S^T, dP^T are
//                               m64n128, dV, dK run 8 K slices), dQ[rows 64cw..] = dS[rows
//                               64cw.., :] K over all 128 keys, after the same barrier: a whole
//                               64-row tile of the accumulator per consumer;
//      each consumer's dQ part goes to shared memory (fp32, in its accumulator's fragment
//      order) and a writer thread (warp 1 of the producer warpgroup) adds it to the fp32
//      accumulator dq_acc [B, Hq, Sq_pad, hd] (64-row tiles in fragment order) with one TMA
//      bulk reduce-add (cp.reduce.async.bulk .add.f32, FA3's dQ writer), as it comes
//      ("atomic") or, "deterministic", in a fixed order per tile behind a semaphore per
//      (b, h, m): key blocks from the last one that sees the tile down to 0. The consumers never touch global
//      memory and never wait for the deterministic turn. dK, dV stay in registers across all
//      steps and are added to dk, dv (bf16) at the end: the CTA alone owns its keys of kv
//      head g (no atomics).
//   3. post: dq += scale * dq_acc (bf16).
//
// Facts used beyond the forward's (sources: PTX ISA 8.x "wgmma.mma_async" (imm-trans-a exists
// only for A in shared memory, and only for .f16/.bf16), "cp.async.bulk" (1-D bulk copy with
// mbarrier complete_tx, 16-byte aligned addresses and sizes), "Memory consistency model: proxies"
// (generic-proxy st.shared must be followed by fence.proxy.async before the async proxy, i.e.
// wgmma, reads it); CUTLASS include/cute/atom/mma_traits_sm90_gmma.hpp: the MN-major SW128
// canonical layout is the same for A as for B, so dS^T [key][q] is an MN-major A exactly as V
// [key][dim] is an MN-major B in the forward, whose tile self-test verified it).
//
// Deadlock freedom of the deterministic order: CTA (n, g, b) waits only for CTA (n+1, g, b)
// (same tile, the next key block), which the grid launches first (blockIdx.x runs the key
// blocks in reverse), hence was scheduled no later (the hardware dispatches a grid's blocks in
// linear order; FA3 relies on the same). Causal: block n+1 starts its tiles at 2n + 2, two
// steps before block n gets there, so in steady state nobody waits (the forward order, block 0
// first, measured 0.82x of the reverse one at 32K). Every wait also gives up after ~2^34
// cycles and records a hang (sm90_bwd_take_hang_report).
//
// What it lacks against cuDNN / FA3: each step's dQ GEMM is waited for before its part is
// stored, the S^T / dP^T GEMMs are m64n64 (hd 64: every GEMM is), a 2-stage Q / dO ring, no
// persistent CTAs. Measurements, and the schedules tried and dropped: docs/performance.md,
// "Hopper attention".
// Registers (ptxas, CUDA 13.0): 168 at launch, producer 24 / consumers 240 after setmaxnreg
// (24 + 2 x 240 = 3 x 168: the sum may not exceed the launch allocation, or setmaxnreg.inc
// waits forever: a first version with a 32-register producer hung on the GPU); the
// deterministic writer spills 4 bytes at hd 128.
#include "kernels/attention_sm90.h"
#include "kernels/attention_sm90_scratch.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "kernels/cuda_check.h"
#include "kernels/sm90_common.cuh"
#include "kernels/wgmma_sm90.cuh"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL))
#error "attention_bwd_sm90.cu must be compiled for sm_90a only (-gencode arch=compute_90a,code=sm_90a)"
#endif

namespace easyctx::kernels {
namespace sm90 {
namespace {

constexpr int kBN = 128;                            // keys per CTA (two consumers x 64)
constexpr int kBM = 64;                             // query rows per step
constexpr uint32_t kKPanelBytes = kBN * kRowBytes;  // one 64-column panel of the K / V block: 16 KiB
constexpr float kLog2e = 1.4426950408889634f;
// Registers per thread (setmaxnreg): 128 * (producer + 2 consumers) <= 64K, i.e. 32 + 2 * 240 =
// 512. The producer's step loop spilled 4 bytes at 24 (ptxas, hd 128); the consumers hold dK and
// dV (2 x hd/2 fp32) plus S^T, dP^T (2 x 32) or the dQ partial (hd/2).
constexpr int kProducerRegsBwd = 24;
constexpr int kConsumerRegsBwd = 240;

// ------------------------------------------------------------------ more PTX
template <int A, int B>
__device__ __forceinline__ void reg_fence_u(uint32_t (&r)[A][B]) {
#pragma unroll
  for (int i = 0; i < A; ++i)
#pragma unroll
    for (int j = 0; j < B; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// 1-D bulk copy global -> shared (PTX "cp.async.bulk"), `bytes` a multiple of 16, both addresses
// 16-byte aligned; completion counted on `bar` like the tensor loads.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
               : "memory");
}

// Generic-proxy writes to shared memory (st.shared) made visible to the async proxy (wgmma
// operand reads): required between writing dS^T and the dQ GEMM (PTX memory model, proxies).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// TMA bulk reduce-add (PTX "cp.reduce.async.bulk", .add.f32): global[dst .. +bytes) += shared[src ..),
// issued by one thread, grouped per thread (bulk_group); `bytes` a multiple of 16.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                   reinterpret_cast<uint64_t>(dst)),
               "r"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Every bulk group of this thread has read its shared-memory source (it may be overwritten).
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// Every bulk group of this thread is complete (its global writes performed), then made
// visible to the generic proxy of this and other threads (the deterministic semaphore).
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(int* p, int v) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// Spins until *sem == want (the deterministic dQ order), giving up like mbar_wait (the hang
// report names the semaphore's low address bits and `want`).
__device__ __forceinline__ void sem_wait(const int* sem, int want) {
  wait_or_give_up([&] { return ld_acquire(sem) == want; }, static_cast<uint32_t>(reinterpret_cast<uintptr_t>(sem)),
                  static_cast<uint32_t>(want), 1);
}

// ------------------------------------------------------------------ the GEMMs
// S^T[64 keys x BM q] = K_cw[64 x HD] Q[BM x HD]^T (or dP^T = V_cw dO^T): A = 64 rows of the
// K (V) block, K-major, at a_base in panel 0 (panels kKPanelBytes apart); B = the Q (dO) tile of
// BM rows (64, or 128 for hd 64's split), K-major, panels BM x 128 bytes apart. Slice kk (16
// dims): panel kk/4, +32 bytes per slice inside the 128-byte row (the forward's gemm_qk
// addressing; N = BM).
template <int HD, int BM = kBM>
__device__ __forceinline__ void gemm_kq(float (&s)[BM / 2], uint32_t a_base, uint32_t b_base) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    const uint32_t panel = kk / 4, off = (kk % 4) * 32;
    const uint64_t da = desc_sw128(a_base + panel * kKPanelBytes + off, 16, 1024);
    const uint64_t db = desc_sw128(b_base + panel * BM * kRowBytes + off, 16, 1024);
    if constexpr (BM == 128) wgmma_m64n128k16_ss(s, da, db, kk > 0 ? 1 : 0);
    else wgmma_m64n64k16_ss(s, da, db, kk > 0 ? 1 : 0);
  }
}

// D[64 keys x HD] += A[64 keys x BM q] B[BM q x HD]: A from registers (BM/16 K slices of 16
// query rows), B = the Q or dO tile as MN-major (the forward's gemm_pv addressing: slice kk at
// +16 rows = 2048 bytes, SBO 1024 = 8 rows, LBO = the next 64-dim panel, BM x 128 bytes on).
template <int HD, int BM = kBM>
__device__ __forceinline__ void gemm_rs(float (&d)[HD / 2], const uint32_t (&a)[BM / 16][4], uint32_t b_base) {
#pragma unroll
  for (int kk = 0; kk < BM / 16; ++kk) {
    const uint64_t desc = desc_sw128(b_base + kk * 16 * kRowBytes, BM * kRowBytes, 1024);
    if constexpr (HD == 128) wgmma_m64n128k16_rs(d, a[kk], desc, 1);
    else wgmma_m64n64k16_rs(d, a[kk], desc, 1);
  }
}

// dQ_cw[64 q x HD] = dS[64 q x 64 keys of consumer cw] K_cw[64 keys x HD]. A: dS^T in shared
// memory, [128 keys][64 q] bf16 swizzled = MN-major A (M = q, one 64-wide panel), slice kk =
// keys 64cw + 16kk.. at +16 rows; B: the K block as MN-major (N = dims, like V in the forward):
// the same rows, LBO = the next 64-dim panel (kKPanelBytes). Overwrites d (scale-d 0 first).
template <int HD>
__device__ __forceinline__ void gemm_dq(float (&d)[HD / 2], uint32_t ds_base, uint32_t k_base, int cw) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t row_off = (64 * cw + 16 * kk) * kRowBytes;
    const uint64_t da = desc_sw128(ds_base + row_off, kKPanelBytes, 1024);
    const uint64_t db = desc_sw128(k_base + row_off, kKPanelBytes, 1024);
    if constexpr (HD == 128) wgmma_m64n128k16_ss_tt(d, da, db, kk > 0 ? 1 : 0);
    else wgmma_m64n64k16_ss_tt(d, da, db, kk > 0 ? 1 : 0);
  }
}

// DqSplit::Columns: dQ[64 q x dims 64p..64p+63] = dS[64 q x 128 keys] K[128 keys x panel p]: A = all
// 128 rows of dS^T (MN-major, as in gemm_dq), B = K's 64-dim panel p (MN-major, one panel),
// slice kk = keys 16kk.. at +16 rows. Overwrites d. DqSplit::Rows (hd 64): the same GEMM with A =
// the dS^T panel of the consumer's 64 query rows and B = all of K (one panel).
__device__ __forceinline__ void gemm_dq_split(float (&d)[32], uint32_t ds_base, uint32_t k_panel) {
#pragma unroll
  for (int kk = 0; kk < kBN / 16; ++kk) {
    const uint32_t row_off = 16 * kk * kRowBytes;
    wgmma_m64n64k16_ss_tt(d, desc_sw128(ds_base + row_off, kKPanelBytes, 1024),
                          desc_sw128(k_panel + row_off, kKPanelBytes, 1024), kk > 0 ? 1 : 0);
  }
}

// An fp32 accumulator [64 x 16 NS] (8 NS per thread) as NS bf16 A fragments of 16 columns each
// (the forward's s_to_p identity: a[kk][i] = bf16x2(d[8kk+2i], d[8kk+2i+1])).
template <int NS>
__device__ __forceinline__ void acc_to_frag(const float (&s)[8 * NS], uint32_t (&a)[NS][4]) {
#pragma unroll
  for (int kk = 0; kk < NS; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) a[kk][i] = pack_bf16(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
}

// Stores this thread's part of a [64 rows x 64 cols] bf16 tile held as A fragments (row r0 =
// 16 warp + lane/4 (+8), cols 8 c8 + 2 (lane%4) + {0,1}) into a 128-byte-swizzled [rows][64]
// buffer (1024-byte aligned) at row offset row_base: 16-byte chunk c8 of row r at c8 ^ (r % 8).
__device__ __forceinline__ void frag_to_smem_sw128(const uint32_t (&a)[4][4], unsigned char* buf, int row_base,
                                                   int warp, int lane) {
#pragma unroll
  for (int c8 = 0; c8 < 8; ++c8)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = row_base + 16 * warp + lane / 4 + 8 * hf;
      const int byte = r * kRowBytes + ((c8 ^ (r % 8)) * 16) + 4 * (lane % 4);
      *reinterpret_cast<uint32_t*>(buf + byte) = a[c8 / 2][(c8 % 2) * 2 + hf];
    }
}

// ------------------------------------------------------------------ kernels
struct BwdArgs {
  __nv_bfloat16* dq;  // [B, Sq, Hq, hd] (q strides)
  __nv_bfloat16* dk;  // [B, Sk, Hkv, hd] (k strides)
  __nv_bfloat16* dv;
  const __nv_bfloat16* o;
  const __nv_bfloat16* dout;
  const float* lse;  // [B, Hq, Sq]
  float* dq_acc;     // [B, Hq, sq_pad, hd]
  float* lse2;       // [B, Hq, sq_pad]
  float* delta;      // [B, Hq, sq_pad]
  int* sem;          // [B, Hq, m_blocks] (deterministic)
  int64_t q_batch, q_row, k_batch, k_row;
  int sq, sk, sq_pad, hq, hkv, group, batch, hd;
  int m_blocks;  // 64-row tiles of sq_pad (the dQ accumulator's tiles, the semaphores)
  int m_tiles;   // query tiles of the main kernel's steps (64 or 128 rows) that cover sq
  int diag;      // clamped to [-(sq+1), sk+1]
  int causal;
  int windowed;  // a sliding window: key j visible to row i only if j > i + wdiag
  int wdiag;     // diag - window, clamped like diag
  float scale, scale_log2;
};

// One warp per padded row (b, h, i), i < sq_pad.
__global__ void bwd_prep_kernel(const BwdArgs a) {
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  const int64_t rows = int64_t(a.batch) * a.hq * a.sq_pad;
  if (row >= rows) return;
  const int64_t i = row % a.sq_pad, bh = row / a.sq_pad, h = bh % a.hq, b = bh / a.hq;
  float s = 0.f;
  if (i < a.sq) {
    const int64_t off = b * a.q_batch + i * a.q_row + h * a.hd;
    for (int c = lane; c < a.hd; c += 32) s += __bfloat162float(a.dout[off + c]) * __bfloat162float(a.o[off + c]);
  }
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
  float* acc = a.dq_acc + row * a.hd;
  for (int c = lane; c < a.hd; c += 32) acc[c] = 0.f;
  if (lane == 0) {
    a.delta[row] = s;
    float l2 = INFINITY;
    if (i < a.sq) {
      const float l = a.lse[bh * a.sq + i];
      l2 = l == -INFINITY ? INFINITY : l * kLog2e;
    }
    a.lse2[row] = l2;
    if (i % kBM == 0) a.sem[bh * a.m_blocks + i / kBM] = 0;
  }
}

// The dQ accumulator's layout (sh.dq and each 64-row tile of dq_acc alike): the m64nHDk16
// accumulator in the order the consumer threads hold it, float4 v = j / 4 of thread tid at
// float index 4 (128 v + tid) + j % 4. A warp's float4 stores then cover 512 contiguous bytes
// (no bank conflicts), and a tile is one contiguous 64 x HD x 4-byte range (one bulk reduce).
// Accumulator element j of thread tid (warp w, lane l) is row 16 w + l / 4 + 8 ((j / 2) % 2),
// column 8 (j / 4) + 2 (l % 4) + j % 2; the post kernel inverts this.
__device__ __forceinline__ int64_t dq_frag_index(int r, int c) {
  const int tid = 32 * (r / 16) + 4 * (r % 8) + (c % 8) / 2, j = 4 * (c / 8) + 2 * ((r % 16) / 8) + (c % 2);
  return 4 * (128 * (j / 4) + tid) + (j % 4);
}

// dq += scale * dq_acc, 2 elements per thread.
__global__ void bwd_post_kernel(const BwdArgs a) {
  const int64_t idx = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * 2;
  const int64_t n = int64_t(a.batch) * a.hq * a.sq * a.hd;
  if (idx >= n) return;
  const int64_t c = idx % a.hd, r = idx / a.hd, i = r % a.sq, bh = r / a.sq, h = bh % a.hq, b = bh / a.hq;
  // Fragment order inside the 64-row tile: columns c, c + 1 (c even) are adjacent floats.
  const float* acc =
      a.dq_acc + (bh * a.sq_pad + i / kBM * kBM) * a.hd + dq_frag_index(static_cast<int>(i % kBM), static_cast<int>(c));
  __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(a.dq + b * a.q_batch + i * a.q_row + h * a.hd + c);
  const __nv_bfloat162 old = *dst;
  *dst = __floats2bfloat162_rn(__low2float(old) + a.scale * acc[0], __high2float(old) + a.scale * acc[1]);
}

// How the two consumers split dQ (FlashAttention-3's split; no partials to sum): both
// consumers' dS^T rows must be written before either dQ GEMM (one 256-thread barrier per step;
// dS^T double buffered so that step t+1 may write while the other consumer still reads step t's).
//   Columns: hd 128: consumer cw computes columns 64cw.. of dQ over all 128 keys: one 32 KiB
//            tile per step, dQ accumulators of 32 registers;
//   Rows:    hd 64 (FlashAttention-3's hd 64 tiles): steps of 128 query rows, so S^T and dP^T
//            are m64n128 and dV / dK run 8 K slices, and consumer cw computes dQ of query rows
//            64cw.. over all 128 keys: a whole 64-row tile of the accumulator each.
enum class DqSplit { Columns, Rows };

template <int HD, DqSplit kDq>
struct BwdSmem {
  static constexpr int kPanels = HD / 64;
  static constexpr int kBMs = kDq == DqSplit::Rows ? 128 : kBM;  // query rows per step
  static constexpr int kDsBufs = 2;
  static constexpr int kDqBufs = kDq == DqSplit::Columns ? 1 : 2;
  alignas(1024) __nv_bfloat16 k[kPanels][kBN * 64];
  alignas(1024) __nv_bfloat16 v[kPanels][kBN * 64];
  alignas(1024) __nv_bfloat16 q[2][kPanels][kBMs * 64];
  alignas(1024) __nv_bfloat16 dout[2][kPanels][kBMs * 64];
  // dS^T [128 keys][kBMs q] as panels of 64 query columns, swizzled.
  alignas(1024) __nv_bfloat16 ds[kDsBufs][kBMs / 64][kBN * 64];
  // The consumers' dQ parts (Columns: one tile, consumer cw's columns in its half; Rows:
  // consumer cw's 64-row tile), in fragment order (dq_frag_index).
  alignas(128) float dq[kDqBufs][kBM * HD];
  alignas(16) float lse2[2][kBMs];
  alignas(16) float delta[2][kBMs];
  alignas(8) uint64_t kv_full, full[2], empty[2];
  uint64_t dq_full[2], dq_empty[2];  // consumer cw's dQ partial in dq[cw] / read by the writer's bulk reduce
};

// Query tiles of BM rows a key block is visible to: m in [m_first, m_end), exactly those with a
// row that sees one of its keys (the deterministic dQ order relies on it: a block waits only for
// blocks that add to the same tile).
template <int BM>
__device__ __forceinline__ int first_m_block(const BwdArgs& a, int n) {
  if (!a.causal) return 0;
  const long long first_row = max(0ll, static_cast<long long>(n) * kBN - a.diag);  // the first row seeing key n*kBN
  return first_row >= a.sq ? a.m_tiles : static_cast<int>(first_row / BM);
}
// With a sliding window, rows from the block's last key - wdiag on see none of its keys.
template <int BM>
__device__ __forceinline__ int end_m_block(const BwdArgs& a, int n) {
  if (!a.windowed) return a.m_tiles;
  const long long last_key = min(static_cast<long long>(n) * kBN + kBN, static_cast<long long>(a.sk)) - 1;
  const long long end_row = min(last_key - a.wdiag, static_cast<long long>(a.sq));  // rows < end_row see it
  return end_row <= 0 ? 0 : static_cast<int>((end_row + BM - 1) / BM);
}

// Named barrier of both consumer warpgroups (256 threads; 0 is __syncthreads).
constexpr int kBarConsumers = 4;

// kDet: the semaphore of query tile m (BM rows) counts the key blocks that have added to it;
// they add from the last block that sees the tile (n_last) down to 0, so block n's turn is
// n_last - n. Block n sees tile m iff n <= n_last (first_m_block), n_last = min(sk - 1, last row
// + diag) / 128 (causal). With a sliding window the blocks that see tile m are n_first .. n_last
// (end_m_block), contiguous, and n_last's block still sees it, so the turns run the same way.
// DqSplit::Rows keeps a 128-row step's semaphore at its first 64-row tile's.
template <int BM = kBM>
__device__ __forceinline__ int dq_turn(const BwdArgs& a, int n, int m) {
  int last_key = a.sk - 1;
  if (a.causal) last_key = min(last_key, min(a.sq - 1, m * BM + BM - 1) + a.diag);
  return last_key / kBN - n;
}

// dQ: one writer thread (warp 1 of the producer warpgroup) adds each consumer's partial to
// dq_acc with a TMA bulk reduce-add straight from shared memory (dq_full / dq_empty mbarriers
// per consumer; FA3's dQ writer), so the consumers never touch global memory or wait for a
// deterministic turn. kDet: the writer waits for the tile's semaphore, adds the consumers'
// parts, waits for them to complete and passes the turn on; the key blocks
// of a tile take turns from the last one that sees it down to block 0 (dq_turn), and the grid
// runs the key blocks in that order too, so a CTA waits only for one launched before it, and
// (causal) the block it waits for started its tiles two steps earlier: no waiting in steady state.
// The writer hands a partial's shared memory back as soon as the bulk reduce has read it
// (its completion is waited for only where the order needs it). Columns: the two halves are
// disjoint columns, so one bulk reduce adds the whole tile (deterministic) or one per half as
// it comes (atomic).
// kWindow: the sliding window's bounds (end_m_block, the left-edge mask): their own
// instantiations, so the kernels without a window keep their registers (the window's compares
// made ptxas spill at hd 64, where the consumers are full).
template <int HD, bool kDet, DqSplit kDq, bool kHeavy, bool kWindow>
__global__ void __launch_bounds__(384, 1)
    attention_bwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                              const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                              const BwdArgs a) {
  extern __shared__ unsigned char smem_raw[];
  BwdSmem<HD, kDq>& sh = aligned_smem<BwdSmem<HD, kDq>>(smem_raw);
  constexpr int kPanels = HD / 64;
  constexpr bool kSplit = kDq == DqSplit::Columns, kRows = kDq == DqSplit::Rows;
  constexpr int kBMs = BwdSmem<HD, kDq>::kBMs;
  static_assert(!kSplit || HD == 128, "the split dQ needs hd 128 (64 columns per consumer)");
  static_assert(!kRows || HD == 64, "the row split is hd 64's");
  // The CTA's key block n and KV head g. kDet: the key blocks in reverse per head (their turns
  // on a tile run from the last block down; deadlock freedom needs each waited-for CTA
  // dispatched first). Atomic: head-major, key blocks in order, or with kHeavy (the launcher's
  // choice for grids of at most 4 waves) the heaviest first over all heads (a causal key
  // block's query steps fall with n: n outer, g inner in dispatch order). Head-major started
  // the heavy blocks of the later heads last: GQA 32/4 x 64 at 8K (256 CTAs of 8-512 steps for
  // 132 SMs) kept the SMs busy 64.5% of the kernel's cycles (ncu, bench/RESULTS.md, 2026-12-03; 99% at 32K), and
  // heavy-first took it from 254-258 to 365 TFLOP/s; on large grids it loses the L2 reuse of
  // the heads' Q / dO streams (32 x 128 atomic-split at 32K / 128K: 441 / 382 against 482-497 /
  // 492-501). A template parameter, not a runtime flag: the flag in every kernel cost the
  // head-major 32 x 128 atomic-split 5% at 32K (474-476 against 501, same call, bench/RESULTS.md, 2026-12-03).
  static_assert(!(kDet && kHeavy), "the deterministic order needs each waited-for key block dispatched first");
  const int lin = blockIdx.y * gridDim.x + blockIdx.x;
  const int n = kDet ? gridDim.x - 1 - blockIdx.x : kHeavy ? lin / gridDim.y : blockIdx.x;
  const int g = kHeavy ? lin % gridDim.y : blockIdx.y, b = blockIdx.z;
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int m_first = first_m_block<kBMs>(a, n);
  const int nm = (kWindow ? end_m_block<kBMs>(a, n) : a.m_tiles) - m_first, steps = a.group * nm;

  if (threadIdx.x == 0) {
    mbar_init(smem_u32(&sh.kv_full), 1);
    for (int s = 0; s < 2; ++s) {
      mbar_init(smem_u32(&sh.full[s]), 1);
      mbar_init(smem_u32(&sh.empty[s]), 8);  // lane 0 of every consumer warp
      // Consumer s's 128 threads arrive on dq_full[s] after writing dq[s] (each arrival releases
      // that thread's stores); the writer on dq_empty[s] once its bulk reduce has read dq[s].
      mbar_init(smem_u32(&sh.dq_full[s]), 128);
      mbar_init(smem_u32(&sh.dq_empty[s]), 1);
    }
    mbar_init_fence();
  }
  __syncthreads();
  if (steps <= 0) return;  // no query row sees these keys: nothing to add (uniform over the CTA)

  if (wg == 0) {  // ---------------------------------------------------- producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegsBwd) : "memory");
    if (tid == 0) {
      mbar_expect_tx(smem_u32(&sh.kv_full), 2 * kPanels * kKPanelBytes);
      for (int p = 0; p < kPanels; ++p) {
        tma_load_4d(smem_u32(&sh.k[p][0]), &tm_k, smem_u32(&sh.kv_full), 64 * p, g, n * kBN, b);
        tma_load_4d(smem_u32(&sh.v[p][0]), &tm_v, smem_u32(&sh.kv_full), 64 * p, g, n * kBN, b);
      }
      for (int t = 0; t < steps; ++t) {
        const int h = g * a.group + t / nm, m = m_first + t % nm, sl = t & 1;
        mbar_wait(smem_u32(&sh.empty[sl]), ((t >> 1) & 1) ^ 1);
        const uint32_t bar = smem_u32(&sh.full[sl]);
        mbar_expect_tx(bar, 2 * kPanels * kBMs * kRowBytes + 2 * kBMs * 4);
        for (int p = 0; p < kPanels; ++p) {
          tma_load_4d(smem_u32(&sh.q[sl][p][0]), &tm_q, bar, 64 * p, h, m * kBMs, b);
          tma_load_4d(smem_u32(&sh.dout[sl][p][0]), &tm_do, bar, 64 * p, h, m * kBMs, b);
        }
        const int64_t r0 = (static_cast<int64_t>(b) * a.hq + h) * a.sq_pad + static_cast<int64_t>(m) * kBMs;
        bulk_load(smem_u32(&sh.lse2[sl][0]), a.lse2 + r0, kBMs * 4, bar);
        bulk_load(smem_u32(&sh.delta[sl][0]), a.delta + r0, kBMs * 4, bar);
      }
    } else if (kRows && tid == 32) {  // ------------------------------- dQ writer, row split
      // Consumer c's tile is the 64-row tile 2m + c of the accumulator: its own rows, one bulk
      // reduce each, in either order (disjoint rows). A half none of whose rows sees a key of
      // this block (causal, its 64-row dq_turn < 0) got exact zeros: not added. kDet: one turn
      // per 128-row step (the semaphore of tile 2m), both halves added before it passes on.
      for (int t = 0; t < steps; ++t) {
        const int h = g * a.group + t / nm, m = m_first + t % nm;
        const int64_t bh = static_cast<int64_t>(b) * a.hq + h;
        int* sem = a.sem + bh * a.m_blocks + 2 * m;
        const int turn = kDet ? dq_turn<2 * kBM>(a, n, m) : 0;
        if constexpr (kDet) sem_wait(sem, turn);
        for (int c = 0; c < 2; ++c) {
          const int mt = 2 * m + c;
          mbar_wait(smem_u32(&sh.dq_full[c]), t & 1);
          if (dq_turn(a, n, mt) >= 0) {
            bulk_reduce_add_f32(a.dq_acc + (bh * a.sq_pad + static_cast<int64_t>(mt) * kBM) * HD,
                                smem_u32(&sh.dq[c][0]), kBM * HD * 4);
            bulk_commit();
            bulk_wait_read();
          }
          mbar_arrive(smem_u32(&sh.dq_empty[c]));
        }
        if constexpr (kDet) {
          bulk_wait_all();
          st_release(sem, turn + 1);
        }
      }
      bulk_wait_all();
    } else if (kSplit && tid == 32) {  // ------------------------------ dQ writer, split tile
      // Consumer cw's half is columns 64cw.. (floats 4096cw.. of the tile in fragment order):
      // the halves are disjoint, so the order between them does not change any sum.
      for (int t = 0; t < steps; ++t) {
        const int h = g * a.group + t / nm, m = m_first + t % nm;
        const int64_t bh = static_cast<int64_t>(b) * a.hq + h;
        float* acc = a.dq_acc + (bh * a.sq_pad + static_cast<int64_t>(m) * kBM) * HD;
        if constexpr (kDet) {
          int* sem = a.sem + bh * a.m_blocks + m;
          const int turn = dq_turn(a, n, m);
          sem_wait(sem, turn);
          mbar_wait(smem_u32(&sh.dq_full[0]), t & 1);
          mbar_wait(smem_u32(&sh.dq_full[1]), t & 1);
          bulk_reduce_add_f32(acc, smem_u32(&sh.dq[0][0]), kBM * HD * 4);
          bulk_commit();
          bulk_wait_read();  // the tile is read: the consumers may refill it while the add completes
          mbar_arrive(smem_u32(&sh.dq_empty[0]));
          mbar_arrive(smem_u32(&sh.dq_empty[1]));
          bulk_wait_all();
          st_release(sem, turn + 1);
        } else {
          for (int c = 0; c < 2; ++c) {
            mbar_wait(smem_u32(&sh.dq_full[c]), t & 1);
            bulk_reduce_add_f32(acc + c * kBM * 64, smem_u32(&sh.dq[0][c * kBM * 64]), kBM * 64 * 4);
            bulk_commit();
            bulk_wait_read();
            mbar_arrive(smem_u32(&sh.dq_empty[c]));
          }
        }
      }
      bulk_wait_all();
    }
    return;
  }

  // ------------------------------------------------------------------ consumers
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegsBwd) : "memory");
  const int cw = wg - 1, warp = tid / 32, lane = tid % 32;
  const int colq = 2 * (lane % 4);
  // This thread's two key rows (accumulator halves hf = 0, 1).
  const int key0 = n * kBN + 64 * cw + 16 * warp + lane / 4;
  const uint32_t k_cw = smem_u32(&sh.k[0][0]) + cw * 64 * kRowBytes;  // 8 KiB: a swizzle-atom multiple
  const uint32_t v_cw = smem_u32(&sh.v[0][0]) + cw * 64 * kRowBytes;
  const bool tile_needs_key_mask = (n + 1) * kBN > a.sk;

  float dk[HD / 2], dv[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) dk[i] = dv[i] = 0.f;

  mbar_wait(smem_u32(&sh.kv_full), 0);
  for (int t = 0; t < steps; ++t) {
    const int m = m_first + t % nm, sl = t & 1;
    const int q0 = m * kBMs;
    mbar_wait(smem_u32(&sh.full[sl]), (t >> 1) & 1);

    // S^T and dP^T.
    float s[kBMs / 2], dp[kBMs / 2];
    reg_fence(dk);
    reg_fence(dv);
    wgmma_fence();
    gemm_kq<HD, kBMs>(s, k_cw, smem_u32(&sh.q[sl][0][0]));
    gemm_kq<HD, kBMs>(dp, v_cw, smem_u32(&sh.dout[sl][0][0]));
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(s);
    reg_fence(dp);

    // P^T = exp2(S^T scale_log2 - lse2[q]) (0 where masked), dS^T = P^T (dP^T - delta[q]).
    // Element i: key row key0 + 8 ((i/2)%2), query column q0 + 8 (i/4) + colq + (i%2).
    const bool need_mask = tile_needs_key_mask || (a.causal && n * kBN + kBN - 1 > q0 + a.diag) ||
                           (kWindow && n * kBN <= q0 + kBMs - 1 + a.wdiag);
#pragma unroll
    for (int c8 = 0; c8 < kBMs / 8; ++c8) {
      const float2 l2 = *reinterpret_cast<const float2*>(&sh.lse2[sl][8 * c8 + colq]);
      const float2 dl = *reinterpret_cast<const float2*>(&sh.delta[sl][8 * c8 + colq]);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int i = 4 * c8 + 2 * hf + j;
          float pv = ex2(fmaf(s[i], a.scale_log2, -(j ? l2.y : l2.x)));
          if (need_mask) {
            const int key = key0 + 8 * hf, qrow = q0 + 8 * c8 + colq + j;
            if constexpr (kWindow) {
              const int d = key - qrow;  // (one subtraction for both bounds)
              if (key >= a.sk || (a.causal && d > a.diag) || d <= a.wdiag) pv = 0.f;
            } else {
              if (key >= a.sk || (a.causal && key > qrow + a.diag)) pv = 0.f;
            }
          }
          s[i] = pv;
          dp[i] = pv * (dp[i] - (j ? dl.y : dl.x));
        }
    }
    uint32_t pf[kBMs / 16][4], dsf[kBMs / 16][4];
    acc_to_frag(s, pf);
    acc_to_frag(dp, dsf);

    // dV += P^T dO, dK += dS^T Q (the scale is applied at the end).
    reg_fence_u(pf);
    reg_fence_u(dsf);
    wgmma_fence();
    gemm_rs<HD, kBMs>(dv, pf, smem_u32(&sh.dout[sl][0][0]));
    gemm_rs<HD, kBMs>(dk, dsf, smem_u32(&sh.q[sl][0][0]));
    wgmma_commit();

    // dS^T to shared memory for the dQ GEMM (while the tensor cores run dV, dK): this consumer's
    // key rows 64cw.. of every query panel; both consumers' rows are read, behind the barrier below.
    const int dsb = t & 1;
#pragma unroll
    for (int p = 0; p < kBMs / 64; ++p)  // query panel p: fragments 4p .. 4p + 3
      frag_to_smem_sw128(*reinterpret_cast<const uint32_t(*)[4][4]>(&dsf[4 * p][0]),
                         reinterpret_cast<unsigned char*>(&sh.ds[dsb][p][0]), 64 * cw, warp, lane);
    fence_proxy_async_smem();
    // Both consumers' dS^T rows of this step written. Passing it also means both finished
    // step t - 1's dQ GEMM (program order), the last reader of buffer (t + 1) & 1.
    named_bar_sync(kBarConsumers, 256);

    wgmma_wait<0>();
    reg_fence(dk);
    reg_fence(dv);
    reg_fence_u(pf);
    reg_fence_u(dsf);
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_u32(&sh.empty[sl]));  // Q, dO, lse2, delta of this slot are read

    // The writer's release of the previous partial in sh.dq[cw], waited for before the dQ GEMM,
    // while no accumulator of it is live (waiting after it spilled 12 bytes at hd 128).
    mbar_wait(smem_u32(&sh.dq_empty[cw]), (t & 1) ^ 1);
    {
      // kSplit: columns 64cw.. over all keys (K panel cw), float4s 8cw.. of the tile's fragment
      // order (dq_frag_index); kRows: rows 64cw.. (dS^T panel cw), consumer cw's own tile.
      float dqp[32];
      wgmma_fence();
      gemm_dq_split(dqp, smem_u32(&sh.ds[dsb][kSplit ? 0 : cw][0]), smem_u32(&sh.k[kSplit ? cw : 0][0]));
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(dqp);
      float* dst = kSplit ? &sh.dq[0][4 * 128 * 8 * cw] : &sh.dq[cw][0];
#pragma unroll
      for (int v4 = 0; v4 < 8; ++v4)
        *reinterpret_cast<float4*>(&dst[4 * (128 * v4 + tid)]) =
            make_float4(dqp[4 * v4], dqp[4 * v4 + 1], dqp[4 * v4 + 2], dqp[4 * v4 + 3]);
    }
    fence_proxy_async_smem();                // the stores above, for the writer's bulk reduce (async proxy)
    mbar_arrive(smem_u32(&sh.dq_full[cw]));  // release: this thread's stores above are seen by the writer
  }

  // Epilogue: dk += scale dK, dv += dV for this thread's two key rows (< Sk).
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int key = key0 + 8 * hf;
    if (key >= a.sk) continue;
    const int64_t off =
        static_cast<int64_t>(b) * a.k_batch + static_cast<int64_t>(key) * a.k_row + static_cast<int64_t>(g) * HD + colq;
#pragma unroll
    for (int c8 = 0; c8 < HD / 8; ++c8) {
      __nv_bfloat162* pk = reinterpret_cast<__nv_bfloat162*>(a.dk + off + 8 * c8);
      __nv_bfloat162* pv = reinterpret_cast<__nv_bfloat162*>(a.dv + off + 8 * c8);
      const __nv_bfloat162 ok = *pk, ov = *pv;
      *pk = __floats2bfloat162_rn(__low2float(ok) + a.scale * dk[4 * c8 + 2 * hf],
                                  __high2float(ok) + a.scale * dk[4 * c8 + 2 * hf + 1]);
      *pv = __floats2bfloat162_rn(__low2float(ov) + dv[4 * c8 + 2 * hf], __high2float(ov) + dv[4 * c8 + 2 * hf + 1]);
    }
  }
}

// ------------------------------------------------------------------ GEMM self-test kernel
template <int HD>
struct BwdTileSmem {
  static constexpr int kPanels = HD / 64;
  alignas(1024) __nv_bfloat16 k[kPanels][kBN * 64];
  alignas(1024) __nv_bfloat16 q[kPanels][kBM * 64];
  alignas(1024) __nv_bfloat16 ds[kBN * 64];
  alignas(8) uint64_t bar;
};

// Two warpgroups (the consumers' roles), keys 64cw.. each, on k [128 x hd], q [64 x hd]:
//   st_out [128 x 64]  = K Q^T                      (gemm_kq: m64n64k16, both K-major)
//   dk_out [128 x hd]  = bf16(st_out) Q             (gemm_rs: register A, Q MN-major, 64-row tile)
//   dq_out [64 x hd]   = bf16(st_out)^T K           (frag_to_smem_sw128 + gemm_dq: A and B MN-major,
//                                                    the two consumers' partials summed)
template <int HD>
__global__ void __launch_bounds__(256)
    bwd_tile_check_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                          float* st_out, float* dk_out, float* dq_out) {
  extern __shared__ unsigned char smem_raw[];
  BwdTileSmem<HD>& sh = aligned_smem<BwdTileSmem<HD>>(smem_raw);
  constexpr int kPanels = HD / 64;
  const int cw = threadIdx.x / 128, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const uint32_t bar = smem_u32(&sh.bar);
  init_one_barrier(bar);
  if (threadIdx.x == 0) {
    mbar_expect_tx(bar, kPanels * (kBN + kBM) * kRowBytes);
    for (int p = 0; p < kPanels; ++p) {
      tma_load_4d(smem_u32(&sh.k[p][0]), &tm_k, bar, 64 * p, 0, 0, 0);
      tma_load_4d(smem_u32(&sh.q[p][0]), &tm_q, bar, 64 * p, 0, 0, 0);
    }
  }
  mbar_wait(bar, 0);
  const int r0 = 64 * cw + 16 * warp + lane / 4, colq = 2 * (lane % 4);
  float s[32];
  wgmma_fence();
  gemm_kq<HD>(s, smem_u32(&sh.k[0][0]) + cw * 64 * kRowBytes, smem_u32(&sh.q[0][0]));
  wgmma_commit();
  wgmma_wait<0>();
  reg_fence(s);
  store_acc(st_out, s, r0, colq, kBM);
  uint32_t f[4][4];
  acc_to_frag(s, f);
  float d[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) d[i] = 0.f;
  reg_fence(d);
  reg_fence_u(f);
  wgmma_fence();
  gemm_rs<HD>(d, f, smem_u32(&sh.q[0][0]));
  wgmma_commit();
  wgmma_wait<0>();
  reg_fence(d);
  reg_fence_u(f);
  store_acc(dk_out, d, r0, colq, HD);
  frag_to_smem_sw128(f, reinterpret_cast<unsigned char*>(&sh.ds[0]), 64 * cw, warp, lane);
  fence_proxy_async_smem();
  __syncthreads();
  wgmma_fence();
  gemm_dq<HD>(d, smem_u32(&sh.ds[0]), smem_u32(&sh.k[0][0]), cw);
  wgmma_commit();
  wgmma_wait<0>();
  reg_fence(d);
  const int qr = 16 * warp + lane / 4;
#pragma unroll
  for (int i = 0; i < HD / 2; ++i)
    atomicAdd(&dq_out[(qr + 8 * ((i / 2) % 2)) * HD + 8 * (i / 4) + colq + (i % 2)], d[i]);
}

// ------------------------------------------------------------------ host side
static_assert(kSm90BwdQueryTile == kBM, "the scratch layout's query tile is the kernel's");
Sm90BwdScratchLayout scratch_layout(const AttentionParams& p) {
  return sm90_bwd_scratch_layout(p.batch, p.hq, p.sq, p.hd);
}

template <int HD, bool kDet, DqSplit kDq>
void launch_bwd(const AttentionParams& p, void* scratch, cudaStream_t st) {
  const Sm90BwdScratchLayout sl = scratch_layout(p);
  BwdArgs a{};
  a.dq = p.dq;
  a.dk = p.dk;
  a.dv = p.dv;
  a.o = p.o;
  a.dout = p.dout;
  a.lse = p.lse;
  unsigned char* base = static_cast<unsigned char*>(scratch);
  a.dq_acc = reinterpret_cast<float*>(base);
  a.lse2 = reinterpret_cast<float*>(base + sl.acc_bytes);
  a.delta = reinterpret_cast<float*>(base + sl.acc_bytes + sl.vec_bytes);
  a.sem = reinterpret_cast<int*>(base + sl.acc_bytes + 2 * sl.vec_bytes);
  a.q_batch = p.q_batch;
  a.q_row = p.q_row;
  a.k_batch = p.k_batch;
  a.k_row = p.k_row;
  a.sq = static_cast<int>(p.sq);
  a.sk = static_cast<int>(p.sk);
  a.sq_pad = static_cast<int>(sl.sq_pad);
  a.hq = static_cast<int>(p.hq);
  a.hkv = static_cast<int>(p.hkv);
  a.group = static_cast<int>(p.hq / p.hkv);
  a.batch = static_cast<int>(p.batch);
  a.m_blocks = static_cast<int>(sl.m_blocks);
  constexpr int kBMs = BwdSmem<HD, kDq>::kBMs;
  a.m_tiles = static_cast<int>((p.sq + kBMs - 1) / kBMs);
  a.hd = HD;
  a.diag = static_cast<int>(std::max<int64_t>(-(p.sq + 1), std::min<int64_t>(p.diag, p.sk + 1)));
  a.causal = p.causal ? 1 : 0;
  a.windowed = p.window > 0 ? 1 : 0;
  a.wdiag = static_cast<int>(std::max<int64_t>(-(p.sq + 1), std::min<int64_t>(p.diag - p.window, p.sk + 1)));
  const dim3 grid(static_cast<unsigned>((p.sk + kBN - 1) / kBN), static_cast<unsigned>(p.hkv),
                  static_cast<unsigned>(p.batch));
  a.scale = p.scale;
  a.scale_log2 = p.scale_log2;

  const int64_t prep_threads = p.batch * p.hq * sl.sq_pad * 32;
  bwd_prep_kernel<<<static_cast<unsigned>((prep_threads + 255) / 256), 256, 0, st>>>(a);
  EASYCTX_CUDA_CHECK_LAUNCH("attention_bwd_sm90 prep");

  const CUtensorMap tq = make_map(p.q, HD, p.sq, p.hq, p.batch, p.q_row, p.q_batch, kBMs, "q");
  const CUtensorMap tdo = make_map(p.dout, HD, p.sq, p.hq, p.batch, p.q_row, p.q_batch, kBMs, "dout");
  const CUtensorMap tk = make_map(p.k, HD, p.sk, p.hkv, p.batch, p.k_row, p.k_batch, kBN, "k");
  const CUtensorMap tv = make_map(p.v, HD, p.sk, p.hkv, p.batch, p.k_row, p.k_batch, kBN, "v");
  // Atomic grids of at most 4 waves: heaviest key blocks first (see the kernel). A sliding window:
  // its own kernel, key blocks in order (its blocks' steps are about equal).
  auto kernel = attention_bwd_sm90_kernel<HD, kDet, kDq, false, false>;
  if (a.windowed) kernel = attention_bwd_sm90_kernel<HD, kDet, kDq, false, true>;
  else if constexpr (!kDet)
    if (int64_t{grid.x} * grid.y * grid.z <= 4 * int64_t{current_device_sms()})
      kernel = attention_bwd_sm90_kernel<HD, kDet, kDq, true, false>;
  const size_t smem = sizeof(BwdSmem<HD, kDq>) + 1024;
  static_assert(sizeof(BwdSmem<HD, kDq>) + 1024 <= 227 * 1024, "over the 227 KB of shared memory a CTA may have");
  EASYCTX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<grid, 384, smem, st>>>(tq, tk, tv, tdo, a);
  EASYCTX_CUDA_CHECK_LAUNCH("attention_bwd_sm90");

  const int64_t post_threads = p.batch * p.hq * p.sq * p.hd / 2;
  bwd_post_kernel<<<static_cast<unsigned>((post_threads + 255) / 256), 256, 0, st>>>(a);
  EASYCTX_CUDA_CHECK_LAUNCH("attention_bwd_sm90 post");
}

template <int HD>
void launch_bwd_tile_check(const __nv_bfloat16* q, const __nv_bfloat16* k, float* st_out, float* dk_out, float* dq_out,
                           cudaStream_t st) {
  const CUtensorMap tq = make_map(q, HD, kBM, 1, 1, HD, kBM * HD, kBM, "q");
  const CUtensorMap tk = make_map(k, HD, kBN, 1, 1, HD, kBN * HD, kBN, "k");
  const size_t smem = sizeof(BwdTileSmem<HD>) + 1024;
  EASYCTX_CUDA_CHECK(cudaFuncSetAttribute(bwd_tile_check_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
  EASYCTX_CUDA_CHECK(cudaMemsetAsync(dq_out, 0, sizeof(float) * kBM * HD, st));
  bwd_tile_check_kernel<HD><<<1, 256, smem, st>>>(tq, tk, st_out, dk_out, dq_out);
  EASYCTX_CUDA_CHECK_LAUNCH("sm90_bwd_tile_check");
}

}  // namespace
}  // namespace sm90

int64_t attention_bwd_sm90_scratch_bytes(const AttentionParams& p) {
  if (p.batch < 1 || p.hq < 1 || p.sq < 1 || (p.hd != 64 && p.hd != 128)) return 0;
  return sm90::scratch_layout(p).total;
}

bool attention_bwd_sm90_supported(const AttentionParams& p, std::string* why) {
  auto no = [&](const char* r) {
    if (why) *why = r;
    return false;
  };
  if (const char* r = sm90::layout_refusal(p)) return no(r);
  if (p.hkv > 65535) return no("more than 65535 kv heads (the grid)");
  if (!p.q || !p.k || !p.v || !p.o || !p.dout || !p.lse || !p.dq || !p.dk || !p.dv)
    return no("a pointer (q, k, v, o, dout, lse, dq, dk, dv) is null");
  if (p.batch * p.hq * ((p.sq + sm90::kBM - 1) / sm90::kBM) > (int64_t{1} << 31) - 1) return no("too many query tiles");
  for (const void* x : {static_cast<const void*>(p.q), static_cast<const void*>(p.k), static_cast<const void*>(p.v),
                        static_cast<const void*>(p.o), static_cast<const void*>(p.dout), static_cast<const void*>(p.dq),
                        static_cast<const void*>(p.dk), static_cast<const void*>(p.dv)})
    if (!sm90::aligned16(x)) return no("q, k, v, o, dout, dq, dk or dv not 16-byte aligned (TMA, bf16x2 stores)");
  if (!sm90_device_available()) return no("the current device is not sm_90");
  return true;
}

void attention_bwd_sm90(const AttentionParams& p, void* scratch, cudaStream_t st, Sm90BwdVariant variant) {
  std::string why;
  if (!attention_bwd_sm90_supported(p, &why)) EASYCTX_THROW("attention_bwd_sm90: unsupported call: ", why);
  if (scratch == nullptr || reinterpret_cast<uintptr_t>(scratch) % 256 != 0)
    EASYCTX_THROW(
        "attention_bwd_sm90: scratch must be a 256-byte aligned buffer of attention_bwd_sm90_scratch_bytes()");
  if (!sm90_bwd_variant_supported(variant, p.hd))
    EASYCTX_THROW("attention_bwd_sm90: variant ", sm90_bwd_variant_name(variant), " does not support head dim ", p.hd);
  const bool h128 = p.hd == 128;
  using sm90::DqSplit;
  if (sm90_bwd_variant_deterministic(variant))
    return h128 ? sm90::launch_bwd<128, true, DqSplit::Columns>(p, scratch, st)
                : sm90::launch_bwd<64, true, DqSplit::Rows>(p, scratch, st);
  return h128 ? sm90::launch_bwd<128, false, DqSplit::Columns>(p, scratch, st)
              : sm90::launch_bwd<64, false, DqSplit::Rows>(p, scratch, st);
}

std::string sm90_bwd_take_hang_report() { return sm90::take_hang_report(); }

void sm90_bwd_tile_check(const __nv_bfloat16* q, const __nv_bfloat16* k, int hd, float* st_out, float* dk_out,
                         float* dq_out, cudaStream_t st) {
  if (!sm90_device_available()) EASYCTX_THROW("sm90_bwd_tile_check: the current device is not sm_90");
  if (hd != 64 && hd != 128) EASYCTX_THROW("sm90_bwd_tile_check: hd must be 64 or 128, got ", hd);
  if (!sm90::aligned16(q) || !sm90::aligned16(k)) EASYCTX_THROW("sm90_bwd_tile_check: q, k must be 16-byte aligned");
  if (hd == 128) sm90::launch_bwd_tile_check<128>(q, k, st_out, dk_out, dq_out, st);
  else sm90::launch_bwd_tile_check<64>(q, k, st_out, dk_out, dq_out, st);
}

}  // namespace easyctx::kernels
