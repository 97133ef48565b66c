// Hopper attention forward (sm_90a only): FlashAttention-3-style, raw PTX (no CUTLASS/CuTe).
//
// What it does: o, lse = softmax(scale * q k^T [masked]) v for bf16 q/k/v/o with fp32 softmax
// statistics, native GQA (kv head = q head / (hq / hkv)), head dim 64 or 128, causal with a
// diagonal offset (key j visible to query i iff j <= i + diag) or unmasked, any Sq/Sk >= 1 and
// batch >= 1 (layouts and meaning: kernels/attention.h). Rows that see no key get o = 0 and
// lse = -inf.
//
// How: a CTA works on tiles of 64 * NC query rows of one (q head, batch), NC = 2 consumer
// warpgroups (3 for hd 64's wide variants) plus a producer warpgroup:
//   warpgroup 0 = producer: one thread issues TMA loads (cp.async.bulk.tensor, 128-byte
//     swizzle, completion counted on mbarriers with expect_tx) of the Q tile once and of K/V
//     tiles of 128 keys into a 2- (or 3-) stage shared-memory ring; it gives its registers away
//     (setmaxnreg.dec 24, 32 in persistent CTAs).
//   warpgroups 1 .. NC = consumers (setmaxnreg.inc 240 / 232 / 160), 64 query rows each: per
//     key tile, S = Q K^T with wgmma (both operands from shared memory, K-major), masking,
//     online softmax in base 2 in registers (fp32 row max / row sum), P rounded to bf16 in
//     registers and fed as the register A operand of O += P V (wgmma, V from shared memory
//     MN-major). Each consumer warp releases a ring slot (mbarrier arrive) as soon as the GEMM
//     reading it has completed. Schedules (template kSched; variants: Sm90FwdVariant in
//     attention_sm90.h): 0 Simple (S GEMM, wait, softmax, P V GEMM, wait); 1 Overlap (issue S_n
//     and P_{n-1} V_{n-1} together, softmax S_n while P V runs: FA3's intra-warpgroup overlap;
//     needs ~190 registers, hence setmaxnreg); 2 PingPong (Overlap, the consumers taking turns
//     to issue, a token per work tile); 3 (Overlap, O rescaled under the S GEMM, the turn token
//     in one ring over all the CTA's work, tree row max, L2 hints on the loads; optionally part
//     of the exponentials as a polynomial on the FMA pipe).
//   Work: one tile per CTA (grid: query tiles x heads x batch, longest causal tiles first), or
//     persistent CTAs (one per SM) whose producer claims tiles from a counter over a list in
//     L2 sections (tile_of) and passes them to the consumers through a 2-slot mbarrier ring.
//   Epilogue: o = O / l straight from registers (bf16x2 stores), lse = (m*scale_log2 +
//   log2 l) * ln 2.
// Ragged tiles: the TMA boxes are bounded by the real Sq/Sk (4-D tensor maps: dim, row, head,
// batch), so rows past the end arrive as zeros (never another head's or batch's data); key
// columns >= Sk and causally hidden keys are set to -inf before the softmax.
//
// Limits / not done yet (issue 26 later steps): O is stored from registers (no TMA store), no
// TMA multicast of K/V across a cluster (each CTA reads its K/V from L2: ~5 TB/s at 650
// TFLOP/s for hd 128), forward only. Registers (ptxas, CUDA 13.0): 168 at launch (128 with 3
// consumers), 0 spills and no stack for every instance; the overlapped hd-128 consumer would
// spill without setmaxnreg.inc (checked: 208 bytes), so ptxas does allocate the consumer
// region to the setmaxnreg value.
//
// Facts this file relies on (sources: PTX ISA 8.x "Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate" sections, CUTLASS include/cute/arch/mma_sm90_desc.hpp; cross-checked
// against public FA3 / hand-written wgmma GEMM kernels):
//  * wgmma shared-memory matrix descriptor (64 bits): [0,14) start address >> 4, [16,30) leading
//    byte offset (LBO) >> 4, [32,46) stride byte offset (SBO) >> 4, [49,52) base offset (0 here:
//    every swizzle atom is 1024-byte aligned), [62,64) layout type (1 = 128-byte swizzle).
//  * 128-byte swizzle (TMA CU_TENSOR_MAP_SWIZZLE_128B and wgmma layout type 1 agree, both act on
//    the shared-memory address bits): rows of 128 bytes (64 bf16), 8 rows = one 1024-byte atom,
//    16-byte chunk c of row r stored at chunk c ^ (r % 8).
//  * K-major SW128 canonical layout ((8,m),(T,2k)):((8T,SBO),(1,T)) (T = 8 bf16 = 16 bytes):
//    SBO = 1024 bytes between 8-row groups, LBO unused ("assumed 1"); the k-th 16-element K slice
//    inside a 128-byte row is addressed by adding 32*k bytes to the start address.
//  * MN-major SW128 canonical layout ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)): 64 contiguous MN
//    elements per 128-byte row, SBO = bytes between 8-row groups along K (1024 here), LBO =
//    bytes between 64-wide MN panels (one TMA panel = 128 keys x 128 bytes = 16384 here).
//  * fp32 accumulator of m64nNk16 (PTX figure "WGMMA .m64nNk16 register fragment layout for
//    accumulator matrix D"): thread t = 32*w + l of the warpgroup holds d[i], i < N/2, at
//    row 16*w + l/4 + 8*((i/2)%2), column 8*(i/4) + 2*(l%4) + (i%2).
//  * register A of m64nNk16 (bf16, 4 x 32-bit registers, same as mma.m16n8k16's A per warp):
//    a[0] = row 16w+l/4, cols 2(l%4)+{0,1}; a[1] = row +8, same cols; a[2] = row 16w+l/4,
//    cols 8+2(l%4)+{0,1}; a[3] = row +8, cols 8+...; the lower column in the low 16 bits.
//    Hence the accumulator of S for keys 16k..16k+15 (d[8k..8k+7]) becomes the A fragment of
//    P for that K slice with no data movement: a[i] = bf16x2(d[8k+2i], d[8k+2i+1]).
#include "kernels/attention_sm90.h"

#include <cuda.h>  // CUtensorMap and its enums only: the driver entry point comes from cudart
#include <cudaTypedefs.h>

#include <cmath>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/sm90_common.cuh"  // PTX helpers, descriptors, make_map (moved there verbatim)
#include "kernels/wgmma_sm90.cuh"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL))
#error "attention_fwd_sm90.cu must be compiled for sm_90a only (-gencode arch=compute_90a,code=sm_90a)"
#endif

namespace easyctx::kernels {
namespace sm90 {
namespace {

constexpr int kBlockN = 128;  // keys per K/V tile
constexpr uint32_t kPanelBytesN = kBlockN * kRowBytes;  // one 64-column panel of a K/V tile

// (The PTX helpers, reg_fence for fp32 arrays, desc_sw128, ex2, pack_bf16, aligned_smem,
// encode_fn, make_map and aligned16 live in kernels/sm90_common.cuh.)
__device__ __forceinline__ void reg_fence(uint32_t (&r)[kBlockN / 16][4]) {
#pragma unroll
  for (int i = 0; i < kBlockN / 16; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}


// ------------------------------------------------------------------ the two GEMMs
// S[64 x 128] = Q[64 x HD] K[128 x HD]^T. q_base: shared address of this warpgroup's 64 rows in
// Q panel 0 (panels q_panel_bytes apart); k_base: K panel 0 (panels kPanelBytesN apart).
// K slice kk (16 elements) lives in panel kk/4 at byte offset 32*(kk%4) of each row.
template <int HD>
__device__ __forceinline__ void gemm_qk(float (&s)[64], uint32_t q_base, uint32_t q_panel_bytes, uint32_t k_base) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    const uint32_t panel = kk / 4, off = (kk % 4) * 32;
    sm90::wgmma_m64n128k16_ss(s, desc_sw128(q_base + panel * q_panel_bytes + off, 16, 1024),
                              desc_sw128(k_base + panel * kPanelBytesN + off, 16, 1024), kk > 0 ? 1 : 0);
  }
}

// O[64 x HD] += P[64 x 128] V[128 x HD]; P as A fragments p[kk] for keys 16kk..16kk+15; V panel
// 0 at v_base. Slice kk starts 16 rows (2 swizzle atoms, 2048 bytes) further; within it SBO
// steps 8 keys (1024 bytes), LBO steps to the next 64 head dims (the next panel).
template <int HD>
__device__ __forceinline__ void gemm_pv(float (&o)[HD / 2], const uint32_t (&p)[kBlockN / 16][4], uint32_t v_base,
                                        uint32_t lbo = kPanelBytesN, uint32_t sbo = 1024) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    const uint64_t d = desc_sw128(v_base + kk * 16 * kRowBytes, lbo, sbo);
    if constexpr (HD == 128)
      sm90::wgmma_m64n128k16_rs(o, p[kk], d, 1);
    else
      sm90::wgmma_m64n64k16_rs(o, p[kk], d, 1);
  }
}

// The S accumulator as bf16 A fragments (identity mapping: see the file header).
__device__ __forceinline__ void s_to_p(const float (&s)[64], uint32_t (&p)[kBlockN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) p[kk][i] = pack_bf16(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
}

// 2^x on the FMA pipe (FlashAttention-4's trick) to unload MUFU.EX2, 16 results per clock per
// SM: at hd 64 a consumer's 64 exponentials per thread and key tile take as long on MUFU as
// its two GEMMs take on the tensor cores (512 clocks each), so the softmax, not the GEMMs,
// paces the ping-pong. x = j + f with
// j = round(x) (the 1.5 * 2^23 shifter: the sum's low mantissa bits hold j), f in [-0.5, 0.5];
// 2^f by a degree-3 minimax polynomial (relative error 7.5e-5, under bf16's 2^-9 rounding of
// P), j added to the exponent field (t's bits << 23 == j << 23 mod 2^32). x is clamped at
// -126 first so that the exponent field stays >= 0, and below -126 the result is exactly 0, as
// MUFU's 2^-inf is: a masked score (-inf) must weigh nothing, also in a row that sees no key
// at all, whose sum would otherwise be a few denormals and its o a mean of V (measured on the
// H200: o 0.28 instead of 0 on the empty rows of a ring block with a negative diagonal).
// __fadd_rn / __fsub_rn: never contracted or reassociated.
__device__ __forceinline__ float ex2_poly(float x) {
  const float xc = fmaxf(x, -126.f);
  const float t = __fadd_rn(xc, 12582912.f);
  const float f = __fsub_rn(xc, __fsub_rn(t, 12582912.f));
  const float p = fmaf(fmaf(fmaf(0.0551716685f, f, 0.2426111251f), f, 0.6932609677f), f, 0.9999280572f);
  const float r = __uint_as_float(__float_as_uint(p) + (__float_as_uint(t) << 23));  // unsigned: wraps, no UB
  return x < -126.f ? 0.f : r;
}

// Online softmax of one S tile in place (base 2): per row (half hf: rows l/4 and l/4 + 8 of the
// warp's 16), the running max m_run (raw score units) and the lane's part of the running sum
// l_run are updated, s becomes p = 2^(s*scale_log2 - m*scale_log2) and corr[hf] the factor
// that rescales what O and l held before. A row with no visible key so far keeps m = -inf and
// subtracts 0 instead, so its p = 2^-inf = 0 and corr = 0 multiply zeros (never -inf - -inf).
// A row's 128 scores sit on the 4 lanes of a quad (32 each): max over the quad by shuffles;
// the sums stay per lane until the epilogue (the quad shares m, hence corr).
// kTree: the row max as a tree (depth 5 instead of a chain of 16 dependent FMNMX; exact, the
// same result) and the sum in 4 interleaved partial sums (a different fp32 order): a shorter
// critical path, which matters as one warp per SM sub-partition runs this at a time.
// kPoly: of every 8 chunks of 8 columns, the first kPoly take ex2_poly instead of MUFU.EX2.
template <bool kTree = false, int kPoly = 0>
__device__ __forceinline__ void online_softmax(float (&s)[64], float (&m_run)[2], float (&l_run)[2], float (&corr)[2],
                                               float scale_log2) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float mx = -INFINITY;
    if constexpr (kTree) {
      float v[kBlockN / 8];
#pragma unroll
      for (int c8 = 0; c8 < kBlockN / 8; ++c8) v[c8] = fmaxf(s[4 * c8 + 2 * hf], s[4 * c8 + 2 * hf + 1]);
      static_assert(kBlockN / 8 == 16, "the tree below folds 16 chunks");
      // Fixed strides, every index a constant (a loop halving its stride left v in local memory).
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = fmaxf(v[i], v[i + 8]);
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = fmaxf(v[i], v[i + 4]);
#pragma unroll
      for (int i = 0; i < 2; ++i) v[i] = fmaxf(v[i], v[i + 2]);
      mx = fmaxf(v[0], v[1]);
    } else {
#pragma unroll
      for (int c8 = 0; c8 < kBlockN / 8; ++c8) mx = fmaxf(mx, fmaxf(s[4 * c8 + 2 * hf], s[4 * c8 + 2 * hf + 1]));
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_run[hf], mx);
    const float base = m_new == -INFINITY ? 0.f : m_new * scale_log2;
    // Exactly 1 while the max holds (most tiles of a long row; also while no key was seen: O, l
    // are 0); 0 at the first key (m_run -inf). Not ex2(m_run * scale_log2 - base): contracted
    // to an FMA, that is the rounding error of base, the same tiny factor != 1 on every tile,
    // so l and O drifted by ~1 ulp per key tile: lse 1.5e-3 low after 1M keys
    // (test_cuda_attention_sm90_long, bench/RESULTS.md, 2026-12-03).
    corr[hf] = m_run[hf] == m_new ? 1.f : ex2((m_run[hf] - m_new) * scale_log2);
    m_run[hf] = m_new;
    constexpr int kSums = kTree ? 4 : 1;
    float sum[kSums];
#pragma unroll
    for (int i = 0; i < kSums; ++i) sum[i] = kTree ? -0.f : 0.f;  // -0 + x folds to x; 0 + x cannot (x = -0)
#pragma unroll
    for (int c8 = 0; c8 < kBlockN / 8; ++c8)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float& x = s[4 * c8 + 2 * hf + j];
        const float y = fmaf(x, scale_log2, -base);
        x = (c8 % 8) < kPoly ? ex2_poly(y) : ex2(y);
        sum[(2 * c8 + j) % kSums] += x;
      }
    float total = sum[0];
#pragma unroll
    for (int i = 1; i < kSums; ++i) total += sum[i];
    l_run[hf] = l_run[hf] * corr[hf] + total;
  }
}

// O rows (half hf) times corr[hf].
template <int HD>
__device__ __forceinline__ void rescale(float (&o)[HD / 2], const float (&corr)[2]) {
#pragma unroll
  for (int c8 = 0; c8 < HD / 8; ++c8)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      o[4 * c8 + 2 * hf] *= corr[hf];
      o[4 * c8 + 2 * hf + 1] *= corr[hf];
    }
}

// ------------------------------------------------------------------ attention kernel
struct FwdArgs {
  __nv_bfloat16* o;
  float* lse;
  int64_t o_batch, o_row;
  int sq, sk, hq, group;  // group = hq / hkv
  int diag;               // clamped to [-(sq+1), sk+1]: same visibility, no overflow
  int causal;
  float scale_log2;
  int m_blocks;  // query tiles per (head, batch)
  int batch;
  int tiles;      // m_blocks * hq * batch (the persistent kernels' work list)
  int sec_heads;  // persistent: (batch, head) pairs per L2 section (see tile_of)
  int* tile_ctr;  // persistent: work tiles handed out past the first gridDim.x, zeroed per launch
};

// NC consumer warpgroups of 64 query rows each: a Q tile of 64 * NC rows.
template <int HD, int NC, int kStages>
struct FwdSmem {
  static constexpr int kPanels = HD / 64;
  // Every panel is a multiple of 1024 bytes, so each starts on a swizzle atom.
  alignas(1024) __nv_bfloat16 q[kPanels][NC * 64 * 64];
  alignas(1024) __nv_bfloat16 k[kStages][kPanels][kBlockN * 64];
  alignas(1024) __nv_bfloat16 v[kStages][kPanels][kBlockN * 64];
  alignas(8) uint64_t q_full, q_empty, k_full[kStages], v_full[kStages], k_empty[kStages], v_empty[kStages];
  uint64_t t_full[2], t_empty[2];  // persistent: the work tile ring (producer -> consumers)
  int tile_id[2];
};


// Registers per thread of the producer / each consumer warpgroup (setmaxnreg): the register
// file (64K) holds 128 * (producer + NC * consumer). NC = 2: 24 + 2 * 240 = 504 (of 512);
// NC = 3: 24 + 3 * 160 = 504 (FA3's hd-64 split; 160 hold S 64 + P 32 + O 32 floats). The
// persistent producer (tile counter, list arithmetic) spills at 24 (ptxas: 8 bytes) and gets
// 32: 32 + 2 * 232 = 496, 32 + 3 * 160 = 512.
template <bool kPersist>
constexpr int kProducerRegs = kPersist ? 32 : 24;
template <int NC, bool kPersist>
constexpr int kConsumerRegs = NC == 2 ? (kPersist ? 232 : 240) : 160;

// The work of one CTA: query tile m_block of head h, batch b.
struct Tile {
  int m_block, h, b;
};
// Work tile `idx` of the persistent kernels' list. The list is cut into L2 sections of
// a.sec_heads consecutive (batch, head) pairs (hb = b * hq + h) whose K/V fit in about 32 MB
// of L2 together (FA3's L2 swizzle); within a section, query tiles longest first (m_block
// descending: the causal ones with the most key tiles), heads inner. So the CTAs running at
// the same time read the K/V of a few heads (L2 hits, not DRAM), GQA heads of one group share
// the very K/V tiles, and each section ends with its shortest tiles. The CTAs take tiles in
// list order as they finish (a counter: greedy, so no static imbalance adds up).
__device__ __forceinline__ Tile tile_of(const FwdArgs& a, int idx) {
  const int per_sec = a.m_blocks * a.sec_heads;
  const int sec = idx / per_sec, local = idx - sec * per_sec;
  const int hb0 = sec * a.sec_heads, nh = min(a.sec_heads, a.hq * a.batch - hb0);
  const int hb = hb0 + local % nh;
  Tile t;
  t.m_block = a.m_blocks - 1 - local / nh;
  t.h = hb % a.hq;
  t.b = hb / a.hq;
  return t;
}

// Key tiles 0 .. n_end-1 hold every key some row of query tile m_block sees.
template <int NC>
__device__ __forceinline__ int key_tiles(const FwdArgs& a, int m_block) {
  const int n_total = (a.sk + kBlockN - 1) / kBlockN;
  if (!a.causal) return n_total;
  const int m0 = m_block * 64 * NC;
  const int last_key = min(m0 + 64 * NC - 1, a.sq - 1) + a.diag;
  return last_key < 0 ? 0 : min(n_total, last_key / kBlockN + 1);
}

// kSched: 0 = one tile at a time, 1 = intra-warpgroup overlap, 2 = overlap + ping-pong (the
// token handed over per work tile), 3 = overlap + ping-pong with O rescaled while the S GEMM
// runs and the token in one ring over all work tiles of the CTA (see the consumer loop).
// NC: consumer warpgroups (2, or 3 for hd 64). kPersist: a persistent CTA walks a tile list.
// kPoly (schedule 3 only): eighths of the exponentials computed on the FMA pipe (ex2_poly).
// kStages: K/V ring depth (2; 3 fits hd 128's 227 KB: 32 KB Q + 3 x 64 KB K/V).
// Schedule 3 also takes online_softmax's shorter-critical-path reductions (kTree).
template <int HD, int NC, int kSched, bool kPersist, int kPoly, int kStages>
__global__ void __launch_bounds__(128 * (1 + NC), 1)
    attention_fwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                              const __grid_constant__ CUtensorMap tm_v, const FwdArgs a) {
  static_assert(NC == 2 || (NC == 3 && HD == 64 && kSched != 2), "3 consumers: hd 64 and schedules 0, 1, 3 only");
  static_assert(kSched == 3 || !kPersist, "persistent CTAs use the ring token (schedule 3)");
  static_assert(kSched == 3 || kPoly == 0, "ex2_poly only in schedule 3");
  constexpr bool kTree = kSched == 3;
  extern __shared__ unsigned char smem_raw[];
  FwdSmem<HD, NC, kStages>& sh = aligned_smem<FwdSmem<HD, NC, kStages>>(smem_raw);
  constexpr int kPanels = HD / 64;
  constexpr int kBM = 64 * NC;                            // query rows per work tile
  constexpr uint32_t kPanelBytesQ = kBM * kRowBytes;      // one 64-column panel of the Q tile

  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    mbar_init(smem_u32(&sh.q_full), 1);
    mbar_init(smem_u32(&sh.q_empty), NC * 4);  // lane 0 of every consumer warp
    for (int s = 0; s < kStages; ++s) {
      mbar_init(smem_u32(&sh.k_full[s]), 1);
      mbar_init(smem_u32(&sh.v_full[s]), 1);
      mbar_init(smem_u32(&sh.k_empty[s]), NC * 4);
      mbar_init(smem_u32(&sh.v_empty[s]), NC * 4);
    }
    for (int s = 0; s < 2; ++s) {
      mbar_init(smem_u32(&sh.t_full[s]), 1);
      mbar_init(smem_u32(&sh.t_empty[s]), NC * 4);
    }
    mbar_init_fence();
  }
  __syncthreads();

  // Both sides walk the same tiles and count the same ring positions: key tile n of a work tile
  // is ring position g = g0 + n (g0 = key tiles of the CTA's earlier work tiles), slot
  // g % kStages, use g / kStages (phase parities). The Q buffer is a ring of one: use qi
  // (work tiles that have keys so far). Work tiles without keys load and compute nothing.
  if (wg == 0) {  // ---------------------------------------------------- producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs<kPersist>) : "memory");
    if (tid == 0) {
      constexpr uint32_t kQBytes = kPanels * kPanelBytesQ, kKVBytes = kPanels * kPanelBytesN;
      // Schedule 3: K/V loads ask L2 to keep their lines (evict_last: the other CTAs of the
      // section read them too), Q loads to drop theirs first (FA3 does the same).
      // The policy is made next to each load (one instruction): held across the loop, its two
      // 64-bit registers made the persistent producer spill.
      constexpr bool kHints = kSched == 3;
      auto load = [&](uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2, int c3, bool kv) {
        if constexpr (kHints)
          tma_load_4d_hint(dst, map, bar, c0, c1, c2, c3, kv ? policy_evict_last() : policy_evict_first());
        else
          tma_load_4d(dst, map, bar, c0, c1, c2, c3);
      };
      int g0 = 0, qi = 0;
      for (int r = 0;; ++r) {
        Tile t;
        if constexpr (kPersist) {
          // Work tile r: the CTA's own first, then the next unclaimed one of the list (claimed
          // when this thread has issued the previous tile's last load, about two K/V tiles
          // before the consumers finish it). Published in ring slot r % 2; the index past the
          // list ends the consumers too.
          const int idx = r == 0 ? static_cast<int>(blockIdx.x) : static_cast<int>(gridDim.x) + atomicAdd(a.tile_ctr, 1);
          const int sl = r & 1;
          mbar_wait(smem_u32(&sh.t_empty[sl]), ((r >> 1) & 1) ^ 1);
          sh.tile_id[sl] = idx;
          mbar_arrive(smem_u32(&sh.t_full[sl]));  // release: the store above is seen after the wait
          if (idx >= a.tiles) break;
          t = tile_of(a, idx);
        } else {
          if (r > 0) break;
          t = Tile{static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
                   static_cast<int>(blockIdx.z)};  // longest causal tiles first
        }
        const int n_end = key_tiles<NC>(a, t.m_block);
        if (n_end == 0) continue;
        const int hk = t.h / a.group;
        // The previous work tile's Q is free once every consumer warp's last S GEMM is done.
        mbar_wait(smem_u32(&sh.q_empty), (qi & 1) ^ 1);
        mbar_expect_tx(smem_u32(&sh.q_full), kQBytes);
        for (int p = 0; p < kPanels; ++p)
          load(smem_u32(&sh.q[p][0]), &tm_q, smem_u32(&sh.q_full), 64 * p, t.h, t.m_block * kBM, t.b, false);
        ++qi;
        // Order K0, K1, V0, K2, V1, ...: K of the next tile before V of this one, so the next
        // S GEMM's operand is never queued behind a V slot that the P V GEMM still holds (the
        // overlapped consumer reads K_{n+1} before V_n).
        auto load_k = [&](int n) {
          const int g = g0 + n, st = g % kStages;
          mbar_wait(smem_u32(&sh.k_empty[st]), ((g / kStages) & 1) ^ 1);
          mbar_expect_tx(smem_u32(&sh.k_full[st]), kKVBytes);
          for (int p = 0; p < kPanels; ++p)
            load(smem_u32(&sh.k[st][p][0]), &tm_k, smem_u32(&sh.k_full[st]), 64 * p, hk, n * kBlockN, t.b, true);
        };
        auto load_v = [&](int n) {
          const int g = g0 + n, st = g % kStages;
          mbar_wait(smem_u32(&sh.v_empty[st]), ((g / kStages) & 1) ^ 1);
          mbar_expect_tx(smem_u32(&sh.v_full[st]), kKVBytes);
          for (int p = 0; p < kPanels; ++p)
            load(smem_u32(&sh.v[st][p][0]), &tm_v, smem_u32(&sh.v_full[st]), 64 * p, hk, n * kBlockN, t.b, true);
        };
        load_k(0);
        for (int n = 0; n < n_end; ++n) {
          if (n + 1 < n_end) load_k(n + 1);
          load_v(n);
        }
        g0 += n_end;
      }
    }
    return;
  }

  // ------------------------------------------------------------------ consumers
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs<NC, kPersist>) : "memory");
  const int cw = wg - 1, warp = tid / 32, lane = tid % 32;
  const int colq = 2 * (lane % 4);  // this thread's first column in each 8-column chunk
  const uint32_t q_base = smem_u32(&sh.q[0][0]) + cw * 64 * kRowBytes;  // 8 KiB: a multiple of 1024
  // Ping-pong, schedule 3: the consumers issue their GEMM phases in turn, cw = 0, 1, .., NC-1,
  // 0, ..., over all work tiles of the CTA (one ring: the order never restarts, so no consumer
  // can run two phases ahead of another at a tile boundary). Consumer cw waits on named barrier
  // 1 + cw and passes to 1 + (cw + 1) % NC, 256 threads each (one warpgroup syncs, one
  // arrives). Consumer 0 does not wait before the CTA's first phase; after the last one it
  // takes the token once more, so barrier 1 sees as many syncs as arrivals and no barrier is
  // left half-arrived when the CTA exits.
  bool first_phase = true;
  auto ring_take = [&]() {
    if constexpr (kSched == 3) {
      if (cw != 0 || !first_phase) named_bar_sync(1 + cw, 256);
      first_phase = false;
    }
  };
  auto ring_pass = [&]() {
    if constexpr (kSched == 3) named_bar_arrive(1 + (cw + 1) % NC, 256);
  };

  int g0 = 0, qi = 0;
  for (int r = 0;; ++r) {
    Tile t;
    if constexpr (kPersist) {
      const int sl = r & 1;
      mbar_wait(smem_u32(&sh.t_full[sl]), (r >> 1) & 1);
      const int idx = *reinterpret_cast<volatile int*>(&sh.tile_id[sl]);
      __syncwarp();
      if (lane == 0) mbar_arrive(smem_u32(&sh.t_empty[sl]));  // the slot may take tile r + 2
      if (idx >= a.tiles) break;
      t = tile_of(a, idx);
    } else {
      if (r > 0) break;
      t = Tile{static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
               static_cast<int>(blockIdx.z)};  // longest causal tiles first
    }
    const int h = t.h, b = t.b;
    const int m0 = t.m_block * kBM;
    const int n_end = key_tiles<NC>(a, t.m_block);
    const int row0 = m0 + cw * 64 + warp * 16 + lane / 4;  // this thread's rows: row0 (half 0), row0 + 8 (half 1)
    // Last visible key of each of the two rows (the mask), Sk - 1 without causality.
    int lim[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) lim[hf] = a.causal ? min(row0 + 8 * hf + a.diag, a.sk - 1) : a.sk - 1;

    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

    if (n_end > 0) {
      mbar_wait(smem_u32(&sh.q_full), qi & 1);
      auto k_addr = [&](int n) { return smem_u32(&sh.k[(g0 + n) % kStages][0][0]); };
      auto v_addr = [&](int n) { return smem_u32(&sh.v[(g0 + n) % kStages][0][0]); };
      auto wait_k = [&](int n) { mbar_wait(smem_u32(&sh.k_full[(g0 + n) % kStages]), ((g0 + n) / kStages) & 1); };
      auto wait_v = [&](int n) { mbar_wait(smem_u32(&sh.v_full[(g0 + n) % kStages]), ((g0 + n) / kStages) & 1); };
      // Every warp releases a slot once its own wait_group has returned (NC * 4 arrivals
      // complete it); after the last S GEMM of the work tile the Q buffer too.
      auto free_k = [&](int n) {
        __syncwarp();
        if (lane == 0) {
          mbar_arrive(smem_u32(&sh.k_empty[(g0 + n) % kStages]));
          if (n == n_end - 1) mbar_arrive(smem_u32(&sh.q_empty));
        }
      };
      auto free_v = [&](int n) {
        __syncwarp();
        if (lane == 0) mbar_arrive(smem_u32(&sh.v_empty[(g0 + n) % kStages]));
      };
      // -inf on the keys of tile n that a row does not see (only tiles that cross Sk or the diagonal).
      auto mask = [&](float (&s)[64], int n) {
        const bool need_mask = (n + 1) * kBlockN > a.sk || (a.causal && (n + 1) * kBlockN - 1 > m0 + a.diag);
        if (!need_mask) return;
        const int key0 = n * kBlockN + colq;
#pragma unroll
        for (int c8 = 0; c8 < kBlockN / 8; ++c8)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf)
#pragma unroll
            for (int j = 0; j < 2; ++j)
              if (key0 + 8 * c8 + j > lim[hf]) s[4 * c8 + 2 * hf + j] = -INFINITY;
      };
      float corr[2];
      uint32_t p[kBlockN / 16][4];

      if constexpr (kSched == 0) {
        // One tile at a time: S GEMM, wait, softmax, P V GEMM, wait.
        for (int n = 0; n < n_end; ++n) {
          float s[64];
          wait_k(n);
          wgmma_fence();
          gemm_qk<HD>(s, q_base, kPanelBytesQ, k_addr(n));
          wgmma_commit();
          wgmma_wait<0>();
          reg_fence(s);
          free_k(n);
          mask(s, n);
          online_softmax<kTree, kPoly>(s, m_run, l_run, corr, a.scale_log2);
          rescale<HD>(o, corr);
          s_to_p(s, p);
          wait_v(n);
          reg_fence(o);
          reg_fence(p);
          wgmma_fence();
          gemm_pv<HD>(o, p, v_addr(n));
          wgmma_commit();
          wgmma_wait<0>();
          reg_fence(o);
          reg_fence(p);
          free_v(n);
        }
      } else {
        // Softmax of tile n runs while the tensor cores do P_{n-1} V_{n-1} (FA3's intra-warpgroup
        // overlap): issue S_n = Q K_n^T, then O += P_{n-1} V_{n-1}; wait for the older group (S_n)
        // only; softmax S_n (O is not touched: the rescale waits); wait for the P V group.
        //  * schedules 1, 2: then rescale O by tile n's correction (O holds tiles < n, all
        //    relative to m_{n-1}); the rescale sits between the P V wait and the next issue.
        //  * schedule 3 (FA3's order): keep tile n's correction until the next phase and rescale
        //    O there, after issuing S_{n+1} and before issuing P_n V_n, so the 64 (hd 128) FMULs
        //    run while the tensor cores do S_{n+1} instead of between two issues.
        //
        // Ping-pong, schedule 2: the consumers take turns issuing their GEMMs, so one's softmax
        // runs while the other's GEMMs occupy the tensor cores. The issue phases of a consumer
        // are k = 0 (S_0), k = n (S_n and P_{n-1} V_{n-1}), k = n_end (the last P V). A token
        // passes through named barriers 1 (consumer 0 waits) and 2 (consumer 1 waits), 256
        // threads each (one consumer syncs, the other arrives). Consumer 0 holds the token at
        // the start (no wait at k = 0); consumer 1 does not pass it after its last phase. Hence
        // barrier 2 sees n_end + 1 syncs and n_end + 1 arrivals, barrier 1 n_end of each: every
        // barrier use completes, none is left half-arrived when the CTA exits (one work tile
        // per CTA: schedule 2 is never persistent). Schedule 3: ring_take / ring_pass above.
        constexpr bool kEarly = kSched == 3;
        auto turn_take = [&](int k) {
          if constexpr (kSched == 2) {
            if (cw == 1 || k > 0) named_bar_sync(1 + cw, 256);
          }
          ring_take();
        };
        auto turn_pass = [&](int k) {
          if constexpr (kSched == 2) {
            if (cw == 0 || k < n_end) named_bar_arrive(2 - cw, 256);
          }
          ring_pass();
        };
        {
          float s[64];
          wait_k(0);
          turn_take(0);
          wgmma_fence();
          gemm_qk<HD>(s, q_base, kPanelBytesQ, k_addr(0));
          wgmma_commit();
          turn_pass(0);
          wgmma_wait<0>();
          reg_fence(s);
          free_k(0);
          mask(s, 0);
          online_softmax<kTree, kPoly>(s, m_run, l_run, corr, a.scale_log2);  // O is 0: corr (0) changes nothing
          s_to_p(s, p);
        }
        for (int n = 1; n < n_end; ++n) {
          float s[64];
          wait_k(n);
          wait_v(n - 1);
          turn_take(n);
          reg_fence(o);
          reg_fence(p);
          wgmma_fence();
          gemm_qk<HD>(s, q_base, kPanelBytesQ, k_addr(n));
          wgmma_commit();
          if constexpr (kEarly) {
            reg_fence(o);  // the FMULs below stay after the S issue
            rescale<HD>(o, corr);  // tile n-1's correction: O (tiles < n-1) to m_{n-1}
            reg_fence(o);
            wgmma_fence();  // O was written by ordinary instructions since the last wgmma
          }
          gemm_pv<HD>(o, p, v_addr(n - 1));
          wgmma_commit();
          turn_pass(n);
          wgmma_wait<1>();  // groups complete in order: S_n is done, P_{n-1} V_{n-1} may not be
          reg_fence(s);
          free_k(n);
          mask(s, n);
          online_softmax<kTree, kPoly>(s, m_run, l_run, corr, a.scale_log2);
          wgmma_wait<0>();
          reg_fence(o);
          reg_fence(p);
          free_v(n - 1);
          if constexpr (!kEarly) rescale<HD>(o, corr);
          s_to_p(s, p);
        }
        if constexpr (kEarly) rescale<HD>(o, corr);  // the last tile's correction (O is complete)
        wait_v(n_end - 1);
        turn_take(n_end);
        reg_fence(o);
        reg_fence(p);
        wgmma_fence();
        gemm_pv<HD>(o, p, v_addr(n_end - 1));
        wgmma_commit();
        turn_pass(n_end);
        wgmma_wait<0>();
        reg_fence(o);
        reg_fence(p);
        free_v(n_end - 1);
      }
      g0 += n_end;
      ++qi;
    }

    // ---------------------------------------------------------------- epilogue
    // (Persistent CTAs: the producer is already loading the next work tile's Q and K/V.)
    constexpr float kLn2 = 0.6931471805599453f;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float l = l_run[hf];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = row0 + 8 * hf;
      if (row >= a.sq) continue;
      const float inv = l > 0.f ? 1.f / l : 0.f;
      __nv_bfloat16* orow = a.o + static_cast<int64_t>(b) * a.o_batch + static_cast<int64_t>(row) * a.o_row +
                            static_cast<int64_t>(h) * HD + colq;
#pragma unroll
      for (int c8 = 0; c8 < HD / 8; ++c8)
        *reinterpret_cast<__nv_bfloat162*>(orow + 8 * c8) =
            __floats2bfloat162_rn(o[4 * c8 + 2 * hf] * inv, o[4 * c8 + 2 * hf + 1] * inv);
      if (lane % 4 == 0)
        a.lse[(static_cast<int64_t>(b) * a.hq + h) * a.sq + row] =
            l > 0.f ? (m_run[hf] * a.scale_log2 + __log2f(l)) * kLn2 : -INFINITY;
    }
  }
  // Schedule 3: take the token the last phase passed (see ring_take).
  if constexpr (kSched == 3) {
    if (cw == 0 && !first_phase) named_bar_sync(1, 256);
  }
}

// ------------------------------------------------------------------ tile self-test kernel
template <int HD>
struct TileSmem {
  static constexpr int kPanels = HD / 64;
  alignas(1024) __nv_bfloat16 q[kPanels][64 * 64];
  alignas(1024) __nv_bfloat16 k[kPanels][kBlockN * 64];
  alignas(1024) __nv_bfloat16 v[kPanels][kBlockN * 64];
  alignas(8) uint64_t bar;
};

// One warpgroup: the attention kernel's GEMM path on one tile (see attention_sm90.h).
template <int HD>
__global__ void __launch_bounds__(128) wgmma_tile_check_kernel(const __grid_constant__ CUtensorMap tm_q,
                                                               const __grid_constant__ CUtensorMap tm_k,
                                                               const __grid_constant__ CUtensorMap tm_v, float* s_out,
                                                               float* o_out, int swap_v_offsets) {
  extern __shared__ unsigned char smem_raw[];
  TileSmem<HD>& sh = aligned_smem<TileSmem<HD>>(smem_raw);
  constexpr int kPanels = HD / 64;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const uint32_t bar = smem_u32(&sh.bar);
  if (tid == 0) {
    mbar_init(bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (tid == 0) {
    mbar_expect_tx(bar, kPanels * (64 + 2 * kBlockN) * kRowBytes);
    for (int p = 0; p < kPanels; ++p) {
      tma_load_4d(smem_u32(&sh.q[p][0]), &tm_q, bar, 64 * p, 0, 0, 0);
      tma_load_4d(smem_u32(&sh.k[p][0]), &tm_k, bar, 64 * p, 0, 0, 0);
      tma_load_4d(smem_u32(&sh.v[p][0]), &tm_v, bar, 64 * p, 0, 0, 0);
    }
  }
  mbar_wait(bar, 0);

  float s[64];
  wgmma_fence();
  gemm_qk<HD>(s, smem_u32(&sh.q[0][0]), 64 * kRowBytes, smem_u32(&sh.k[0][0]));
  wgmma_commit();
  wgmma_wait<0>();
  reg_fence(s);
  const int row0 = warp * 16 + lane / 4, colq = 2 * (lane % 4);
#pragma unroll
  for (int i = 0; i < 64; ++i) s_out[(row0 + 8 * ((i / 2) % 2)) * kBlockN + 8 * (i / 4) + colq + (i % 2)] = s[i];

  uint32_t p[kBlockN / 16][4];
  s_to_p(s, p);
  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
  reg_fence(o);
  reg_fence(p);
  wgmma_fence();
  if (swap_v_offsets)  // diagnostic only: LBO and SBO of the MN-major V descriptor exchanged
    gemm_pv<HD>(o, p, smem_u32(&sh.v[0][0]), 1024, kPanelBytesN);
  else
    gemm_pv<HD>(o, p, smem_u32(&sh.v[0][0]));
  wgmma_commit();
  wgmma_wait<0>();
  reg_fence(o);
  reg_fence(p);
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o_out[(row0 + 8 * ((i / 2) % 2)) * HD + 8 * (i / 4) + colq + (i % 2)] = o[i];
}

// ------------------------------------------------------------------ host side
constexpr unsigned kTileCounters = 64;
std::atomic<int64_t> g_l2_section_bytes{0};  // sm90_set_l2_section_bytes (0: 32 MiB)
__device__ int g_tile_counters[kTileCounters];  // the persistent kernels' work counters (launch_fwd)

template <int HD, int NC, int kSched, bool kPersist, int kPoly = 0, int kStages = 2>
void launch_fwd(const AttentionParams& p, cudaStream_t st) {
  constexpr int kBM = 64 * NC;
  const CUtensorMap tq = make_map(p.q, HD, p.sq, p.hq, p.batch, p.q_row, p.q_batch, kBM, "q");
  const CUtensorMap tk = make_map(p.k, HD, p.sk, p.hkv, p.batch, p.k_row, p.k_batch, kBlockN, "k");
  const CUtensorMap tv = make_map(p.v, HD, p.sk, p.hkv, p.batch, p.k_row, p.k_batch, kBlockN, "v");
  FwdArgs a{};
  a.o = p.o_out;
  a.lse = p.lse_out;
  a.o_batch = p.q_batch;
  a.o_row = p.q_row;
  a.sq = static_cast<int>(p.sq);
  a.sk = static_cast<int>(p.sk);
  a.hq = static_cast<int>(p.hq);
  a.group = static_cast<int>(p.hq / p.hkv);
  a.diag = static_cast<int>(std::max<int64_t>(-(p.sq + 1), std::min<int64_t>(p.diag, p.sk + 1)));
  a.causal = p.causal ? 1 : 0;
  a.scale_log2 = p.scale_log2;
  const int64_t m_blocks = (p.sq + kBM - 1) / kBM, tiles = m_blocks * p.hq * p.batch;
  if (kPersist && tiles > (int64_t{1} << 31) - 1)
    EASYCTX_THROW("attention_fwd_sm90: ", tiles, " work tiles do not fit the persistent kernel's int counter");
  a.m_blocks = static_cast<int>(m_blocks);
  a.batch = static_cast<int>(p.batch);
  a.tiles = static_cast<int>(std::min<int64_t>(tiles, (int64_t{1} << 31) - 1));
  auto kernel = attention_fwd_sm90_kernel<HD, NC, kSched, kPersist, kPoly, kStages>;
  const size_t smem = sizeof(FwdSmem<HD, NC, kStages>) + 1024;
  static_assert(sizeof(FwdSmem<HD, NC, kStages>) + 1024 <= 227 * 1024, "over the 227 KB of shared memory a CTA may have");
  EASYCTX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  dim3 grid(static_cast<unsigned>(m_blocks), static_cast<unsigned>(p.hq), static_cast<unsigned>(p.batch));
  if constexpr (kPersist) {
    // One CTA per SM (the shared memory and registers allow no second one), each taking work
    // tiles of the list (tile_of) until it is used up.
    grid = dim3(static_cast<unsigned>(std::min<int64_t>(tiles, std::max(current_device_sms(), 1))), 1, 1);
    // L2 sections: as many kv heads as fit 32 MB of K + V (at least one), times the GQA group
    // (the q heads that read them); sections never straddle a kv group.
    const int64_t kv_bytes = p.sk * HD * 2 * 2, budget = g_l2_section_bytes.load(std::memory_order_relaxed);
    const int64_t kv_heads = std::max<int64_t>(1, (budget > 0 ? budget : int64_t{32} << 20) / std::max<int64_t>(kv_bytes, 1));
    a.sec_heads = static_cast<int>(std::min<int64_t>(kv_heads * a.group, p.hq * p.batch));
    // The tile counter: one of kTileCounters device ints, a different one for each launch in
    // turn (so launches that overlap on different streams do not share one unless
    // kTileCounters of them are in flight), zeroed on the stream right before the launch.
    static std::atomic<unsigned> next_counter{0};
    int* counters = nullptr;
    EASYCTX_CUDA_CHECK(cudaGetSymbolAddress(reinterpret_cast<void**>(&counters), g_tile_counters));
    a.tile_ctr = counters + next_counter.fetch_add(1, std::memory_order_relaxed) % kTileCounters;
    EASYCTX_CUDA_CHECK(cudaMemsetAsync(a.tile_ctr, 0, sizeof(int), st));
  }
  kernel<<<grid, 128 * (1 + NC), smem, st>>>(tq, tk, tv, a);
  EASYCTX_CUDA_CHECK_LAUNCH("attention_fwd_sm90");
}

template <int HD>
void launch_tile_check(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, float* s_out, float* o_out, int swap,
                       cudaStream_t st) {
  const CUtensorMap tq = make_map(q, HD, 64, 1, 1, HD, 64 * HD, 64, "q");
  const CUtensorMap tk = make_map(k, HD, kBlockN, 1, 1, HD, kBlockN * HD, kBlockN, "k");
  const CUtensorMap tv = make_map(v, HD, kBlockN, 1, 1, HD, kBlockN * HD, kBlockN, "v");
  const size_t smem = sizeof(TileSmem<HD>) + 1024;
  EASYCTX_CUDA_CHECK(
      cudaFuncSetAttribute(wgmma_tile_check_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  wgmma_tile_check_kernel<HD><<<1, 128, smem, st>>>(tq, tk, tv, s_out, o_out, swap);
  EASYCTX_CUDA_CHECK_LAUNCH("sm90_wgmma_tile_check");
}

}  // namespace
}  // namespace sm90

bool sm90_device_available() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major == 9 && minor == 0;
}

bool attention_fwd_sm90_supported(const AttentionParams& p, std::string* why) {
  auto no = [&](const char* r) {
    if (why) *why = r;
    return false;
  };
  if (const char* r = sm90::layout_refusal(p)) return no(r);
  if (p.hq > 65535) return no("more than 65535 query heads (the grid)");
  if (!p.q || !p.k || !p.v || !p.o_out || !p.lse_out) return no("a pointer (q, k, v, o_out, lse_out) is null");
  if (!sm90::aligned16(p.q) || !sm90::aligned16(p.k) || !sm90::aligned16(p.v) || !sm90::aligned16(p.o_out))
    return no("q, k, v or o_out not 16-byte aligned (TMA)");
  if (!sm90_device_available()) return no("the current device is not sm_90");
  return true;
}

bool sm90_fwd_variant_supported(Sm90FwdVariant v, int64_t hd) {
  using V = Sm90FwdVariant;
  if (hd != 64 && hd != 128) return false;
  if (v == V::Wide || v == V::WidePersistent || v == V::WidePoly) return hd == 64;  // 3 x 160 registers cannot hold hd 128's O
  return true;
}

Sm90FwdVariant sm90_fwd_resolve(Sm90FwdVariant v, int64_t hd) {
  using V = Sm90FwdVariant;
  if (v != V::Auto) return v;
  // EASYCTX_SM90_VARIANT (a name of sm90_fwd_variant_name) overrides the choice below when
  // that variant supports hd; read once per process.
  static const std::string env = [] {
    const char* e = std::getenv("EASYCTX_SM90_VARIANT");
    return std::string(e ? e : "");
  }();
  if (!env.empty())
    for (const V x : sm90_fwd_variants())
      if (env == sm90_fwd_variant_name(x) && sm90_fwd_variant_supported(x, hd)) return x;
  // The fastest measured (H200, bench_attention --sm90-only, bench/RESULTS.md, 2026-12-02): hd 128
  // the persistent ping-pong (620 TFLOP/s causal at 32K and 128K, 655 at 8K), hd 64 the
  // 3-consumer 192-row tile (495-501 causal at 32K-128K, 498-499 unmasked; wide-persistent
  // wins only at 8K causal, 464 vs 446).
  return hd == 64 ? V::Wide : V::Persistent;
}

std::vector<Sm90FwdVariant> sm90_fwd_variants() {
  using V = Sm90FwdVariant;
  return {V::Simple,    V::Overlap, V::PingPong,       V::PingPong2, V::Persistent,
          V::Persistent3, V::Wide,  V::WidePersistent, V::WidePoly};
}

void attention_fwd_sm90(const AttentionParams& p, cudaStream_t st, Sm90FwdVariant variant) {
  std::string why;
  if (!attention_fwd_sm90_supported(p, &why)) EASYCTX_THROW("attention_fwd_sm90: unsupported call: ", why);
  variant = sm90_fwd_resolve(variant, p.hd);
  if (!sm90_fwd_variant_supported(variant, p.hd))
    EASYCTX_THROW("attention_fwd_sm90: variant ", sm90_fwd_variant_name(variant), " does not support head dim ", p.hd);
  const bool h128 = p.hd == 128;
  switch (variant) {
    case Sm90FwdVariant::Simple:
      return h128 ? sm90::launch_fwd<128, 2, 0, false>(p, st) : sm90::launch_fwd<64, 2, 0, false>(p, st);
    case Sm90FwdVariant::Overlap:
      return h128 ? sm90::launch_fwd<128, 2, 1, false>(p, st) : sm90::launch_fwd<64, 2, 1, false>(p, st);
    case Sm90FwdVariant::PingPong:
      return h128 ? sm90::launch_fwd<128, 2, 2, false>(p, st) : sm90::launch_fwd<64, 2, 2, false>(p, st);
    case Sm90FwdVariant::PingPong2:
      return h128 ? sm90::launch_fwd<128, 2, 3, false>(p, st) : sm90::launch_fwd<64, 2, 3, false>(p, st);
    case Sm90FwdVariant::Persistent:
      return h128 ? sm90::launch_fwd<128, 2, 3, true>(p, st) : sm90::launch_fwd<64, 2, 3, true>(p, st);
    case Sm90FwdVariant::Persistent3:
      return h128 ? sm90::launch_fwd<128, 2, 3, true, 0, 3>(p, st) : sm90::launch_fwd<64, 2, 3, true, 0, 3>(p, st);
    case Sm90FwdVariant::Wide:
      return sm90::launch_fwd<64, 3, 3, false>(p, st);
    case Sm90FwdVariant::WidePersistent:
      return sm90::launch_fwd<64, 3, 3, true>(p, st);
    case Sm90FwdVariant::WidePoly:
      return sm90::launch_fwd<64, 3, 3, true, 2>(p, st);
    case Sm90FwdVariant::Auto:
      break;
  }
  EASYCTX_THROW("attention_fwd_sm90: unknown variant ", static_cast<int>(variant));
}

void sm90_set_l2_section_bytes(int64_t bytes) { sm90::g_l2_section_bytes.store(bytes, std::memory_order_relaxed); }

std::string sm90_take_hang_report() {
  unsigned int h[8] = {};
  EASYCTX_CUDA_CHECK(cudaMemcpyFromSymbol(h, sm90::g_hang, sizeof(h)));
  if (h[0] == 0) return "";
  const unsigned int zero[8] = {};
  EASYCTX_CUDA_CHECK(cudaMemcpyToSymbol(sm90::g_hang, zero, sizeof(zero)));
  return "an mbarrier wait gave up after ~2^34 cycles: block (" + std::to_string(h[1]) + "," + std::to_string(h[2]) + "," +
         std::to_string(h[3]) + ") thread " + std::to_string(h[4]) + " (warpgroup " + std::to_string(h[4] / 128) +
         ") barrier at shared 0x" + [&] {
           char b[16];
           std::snprintf(b, sizeof(b), "%x", h[5]);
           return std::string(b);
         }() + " parity " + std::to_string(h[6]);
}

const char* sm90_fwd_variant_name(Sm90FwdVariant v) {
  switch (v) {
    case Sm90FwdVariant::Simple:
      return "simple";
    case Sm90FwdVariant::Overlap:
      return "overlap";
    case Sm90FwdVariant::PingPong:
      return "pingpong";
    case Sm90FwdVariant::PingPong2:
      return "pingpong2";
    case Sm90FwdVariant::Persistent:
      return "persistent";
    case Sm90FwdVariant::Persistent3:
      return "persistent3";
    case Sm90FwdVariant::Wide:
      return "wide";
    case Sm90FwdVariant::WidePersistent:
      return "wide-persistent";
    case Sm90FwdVariant::WidePoly:
      return "wide-poly";
    case Sm90FwdVariant::Auto:
      return "auto";
  }
  return "?";
}

void sm90_wgmma_tile_check(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int hd, float* s_out,
                           float* o_out, cudaStream_t st, bool swap_v_offsets) {
  if (!sm90_device_available()) EASYCTX_THROW("sm90_wgmma_tile_check: the current device is not sm_90");
  if (hd != 64 && hd != 128) EASYCTX_THROW("sm90_wgmma_tile_check: hd must be 64 or 128, got ", hd);
  if (!sm90::aligned16(q) || !sm90::aligned16(k) || !sm90::aligned16(v))
    EASYCTX_THROW("sm90_wgmma_tile_check: q, k, v must be 16-byte aligned");
  if (hd == 128)
    sm90::launch_tile_check<128>(q, k, v, s_out, o_out, swap_v_offsets ? 1 : 0, st);
  else
    sm90::launch_tile_check<64>(q, k, v, s_out, o_out, swap_v_offsets ? 1 : 0, st);
}

}  // namespace easyctx::kernels
