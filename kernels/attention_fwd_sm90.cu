// Hopper attention forward (sm_90a only): FlashAttention-3's structure in raw PTX (no
// CUTLASS/CuTe), because on an H100/H200 it beats the FlashAttention-2 kernel and, at the shapes
// of sm90_before_cudnn (lib/ops/attention_route.h), cuDNN's forward (docs/performance.md).
// Contract: kernels/attention.h (bf16 q/k/v/o, fp32 lse, GQA, head dim 64 or 128, causal with a
// diagonal offset or unmasked, a sliding window's lower key bound, ragged Sq/Sk; rows that see no
// key get o = 0, lse = -inf).
//
// A CTA has a producer warpgroup (one thread issues the TMA loads of the Q tile and of 128-key
// K/V tiles into a 2-stage shared-memory ring, completion counted on mbarriers) and NC consumer
// warpgroups of 64 query rows each (S = Q K^T and O += P V with wgmma, online softmax in base 2
// in registers, P fed back as the register A operand). The consumers overlap the softmax of
// tile n with P_{n-1} V_{n-1} and take turns issuing their GEMMs (ping-pong), so the tensor
// cores stay busy. Variants: kernels/attention_sm90_variants.h; the hardware layouts relied
// on: kernels/sm90_common.cuh. Ragged tiles: TMA boxes are bounded by the real Sq/Sk, so rows
// past the end arrive as zeros; keys >= Sk and hidden keys are set to -inf before the softmax.
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
#include "kernels/sm90_common.cuh"  // PTX helpers, descriptors, make_map
#include "kernels/wgmma_sm90.cuh"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL))
#error "attention_fwd_sm90.cu must be compiled for sm_90a only (-gencode arch=compute_90a,code=sm_90a)"
#endif

namespace easyctx::kernels {
namespace sm90 {
namespace {

constexpr int kBlockN = 128;                            // keys per K/V tile
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
    if constexpr (HD == 128) sm90::wgmma_m64n128k16_rs(o, p[kk], d, 1);
    else sm90::wgmma_m64n64k16_rs(o, p[kk], d, 1);
  }
}

// The S accumulator as bf16 A fragments (identity mapping: see the file header).
__device__ __forceinline__ void s_to_p(const float (&s)[64], uint32_t (&p)[kBlockN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) p[kk][i] = pack_bf16(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
}

// Online softmax of one S tile in place (base 2): per row (half hf: rows l/4 and l/4 + 8 of the
// warp's 16), the running max m_run (raw score units) and the lane's part of the running sum
// l_run are updated, s becomes p = 2^(s*scale_log2 - m*scale_log2) and corr[hf] the factor
// that rescales what O and l held before. A row with no visible key so far keeps m = -inf and
// subtracts 0 instead, so its p = 2^-inf = 0 and corr = 0 multiply zeros (never -inf - -inf).
// A row's 128 scores sit on the 4 lanes of a quad (32 each): max over the quad by shuffles;
// the sums stay per lane until the epilogue (the quad shares m, hence corr).
// The row max is a tree (depth 5 instead of a chain of 16 dependent FMNMX; exact) and the sum
// is 4 interleaved partial sums: a shorter critical path, which matters as one warp per SM
// sub-partition runs this at a time.
__device__ __forceinline__ void online_softmax(float (&s)[64], float (&m_run)[2], float (&l_run)[2], float (&corr)[2],
                                               float scale_log2) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float mx = -INFINITY;
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
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_run[hf], mx);
    const float base = m_new == -INFINITY ? 0.f : m_new * scale_log2;
    // Exactly 1 while the max holds (most tiles of a long row; also while no key was seen: O, l
    // are 0); 0 at the first key (m_run -inf). Not ex2(m_run * scale_log2 - base): contracted
    // to an FMA, that is the rounding error of base, the same tiny factor != 1 on every tile,
    // so l and O drift by ~1 ulp per key tile (lse 1.5e-3 low after 1M keys:
    // test_cuda_attention_sm90_long pins it).
    corr[hf] = m_run[hf] == m_new ? 1.f : ex2((m_run[hf] - m_new) * scale_log2);
    m_run[hf] = m_new;
    constexpr int kSums = 4;
    float sum[kSums];
#pragma unroll
    for (int i = 0; i < kSums; ++i) sum[i] = -0.f;  // -0 + x folds to x; 0 + x cannot (x = -0)
#pragma unroll
    for (int c8 = 0; c8 < kBlockN / 8; ++c8)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float& x = s[4 * c8 + 2 * hf + j];
        const float y = fmaf(x, scale_log2, -base);
        x = ex2(y);
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
  int windowed;  // a sliding window: key j visible to row i only if j > i + wdiag
  int wdiag;     // diag - window, clamped like diag
  float scale_log2;
  int m_blocks;  // query tiles per (head, batch)
  int batch;
  int tiles;      // m_blocks * hq * batch (the persistent kernel's work list)
  int sec_heads;  // persistent: (batch, head) pairs per L2 section (see tile_of)
  int* tile_ctr;  // persistent: work tiles handed out past the first gridDim.x, zeroed per launch
};

constexpr int kStages = 2;  // K/V ring depth

// NC consumer warpgroups of 64 query rows each: a Q tile of 64 * NC rows.
template <int HD, int NC>
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
// persistent producer (tile counter, list arithmetic, a sliding window's first key tile)
// spills at 24 (ptxas: 8 bytes) and at 32 (4 bytes) and gets 40: 40 + 2 * 232 = 504, the launch
// allocation (3 x 168; setmaxnreg.inc waits forever past it: attention_bwd_sm90.cu's note).
template <bool kPersist>
constexpr int kProducerRegs = kPersist ? 40 : 24;
template <int NC, bool kPersist>
constexpr int kConsumerRegs = NC == 2 ? (kPersist ? 232 : 240) : 160;

// ------------------------------------------------------------------ tile scheduler
// The work of one CTA: query tile m_block of head h, batch b.
struct Tile {
  int m_block, h, b;
};
// Work tile `idx` of the persistent kernel's list. The list is cut into L2 sections of
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

// The one work tile of a non-persistent CTA: the grid's query tiles in reverse, so the longest
// causal tiles start first.
__device__ __forceinline__ Tile grid_tile() {
  return Tile{static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
              static_cast<int>(blockIdx.z)};
}

// Work tile r of the CTA into t; false when the CTA has no more work. One tile per CTA, or
// (persistent) the producer's thread claims tile r: the CTA's own first, then the next unclaimed
// one of the list (claimed when it has issued the previous tile's last load, about two K/V
// tiles before the consumers finish it), and publishes it in ring slot r % 2, where every
// consumer warp reads it; the index past the list ends the consumers too.
template <bool kPersist, bool kProducer, class Smem>
__device__ __forceinline__ bool next_tile(Smem& sh, const FwdArgs& a, int r, int lane, Tile& t) {
  if constexpr (kPersist) {
    int idx, sl;
    if constexpr (kProducer) {
      idx = r == 0 ? static_cast<int>(blockIdx.x) : static_cast<int>(gridDim.x) + atomicAdd(a.tile_ctr, 1);
      sl = r & 1;
      mbar_wait(smem_u32(&sh.t_empty[sl]), ((r >> 1) & 1) ^ 1);
      sh.tile_id[sl] = idx;
      mbar_arrive(smem_u32(&sh.t_full[sl]));  // release: the store above is seen after the wait
    } else {
      sl = r & 1;
      mbar_wait(smem_u32(&sh.t_full[sl]), (r >> 1) & 1);
      idx = *reinterpret_cast<volatile int*>(&sh.tile_id[sl]);
      __syncwarp();
      if (lane == 0) mbar_arrive(smem_u32(&sh.t_empty[sl]));  // the slot may take tile r + 2
    }
    if (idx >= a.tiles) return false;
    t = tile_of(a, idx);
  } else {
    if (r > 0) return false;
    t = grid_tile();
  }
  return true;
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

// With a sliding window, key tiles before first_key_tile hold no key any row of the query tile
// sees (its first row's window starts after them, and later rows' windows start later).
template <int NC>
__device__ __forceinline__ int first_key_tile(const FwdArgs& a, int m_block) {
  if (!a.windowed) return 0;
  const long long first_key = static_cast<long long>(m_block) * 64 * NC + a.wdiag + 1;  // (64-bit: no overflow)
  return first_key <= 0 ? 0 : static_cast<int>(first_key / kBlockN);
}

template <int HD, int NC>
__device__ __forceinline__ void init_barriers(FwdSmem<HD, NC>& sh) {
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

// Both sides walk the same tiles and count the same ring positions: the n-th key tile loaded for
// a work tile (key tile n_first + n: a sliding window skips the tiles before its reach) is ring
// position g = g0 + n (g0 = key tiles loaded for the CTA's earlier work tiles), slot g % kStages,
// use g / kStages (phase parities). The Q buffer is a ring of one: use qi (work tiles that have keys
// so far). Work tiles without keys load and compute nothing.

// ------------------------------------------------------------------ producer
// A TMA load; K/V loads ask L2 to keep their lines (evict_last: the other CTAs of the section
// read them too), Q loads to drop theirs first (FA3 does the same). The policy is made next to
// each load (one instruction): held across the loop, its two 64-bit registers made the
// persistent producer spill.
__device__ __forceinline__ void load_tile(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                          int c3, bool kv) {
  tma_load_4d_hint(dst, map, bar, c0, c1, c2, c3, kv ? policy_evict_last() : policy_evict_first());
}

// K or V tile nt of the work tile (absolute: a sliding window starts past 0) into its ring slot
// gb + nt, once the consumers have freed it.
template <int HD, int NC>
__device__ __forceinline__ void load_kv(FwdSmem<HD, NC>& sh, __nv_bfloat16 (&buf)[kStages][HD / 64][kBlockN * 64],
                                        uint64_t (&full)[kStages], uint64_t (&empty)[kStages], const CUtensorMap* map,
                                        int gb, int nt, int hk, int b) {
  constexpr int kPanels = HD / 64;
  constexpr uint32_t kKVBytes = kPanels * kPanelBytesN;
  const int g = gb + nt, st = g % kStages;
  mbar_wait(smem_u32(&empty[st]), ((g / kStages) & 1) ^ 1);
  mbar_expect_tx(smem_u32(&full[st]), kKVBytes);
  for (int p = 0; p < kPanels; ++p)
    load_tile(smem_u32(&buf[st][p][0]), map, smem_u32(&full[st]), 64 * p, hk, nt * kBlockN, b, true);
}

// One thread: the Q tile and the n_end K/V tiles of every work tile of the CTA.
template <int HD, int NC, bool kPersist>
__device__ __forceinline__ void producer(FwdSmem<HD, NC>& sh, const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                                         const CUtensorMap* tm_v, const FwdArgs& a) {
  constexpr int kPanels = HD / 64;
  constexpr int kBM = 64 * NC;
  constexpr uint32_t kQBytes = kPanels * kBM * kRowBytes;
  int g0 = 0, qi = 0;
  for (int r = 0;; ++r) {
    Tile t;
    if (!next_tile<kPersist, true>(sh, a, r, 0, t)) break;
    // Key tiles n_first .. n_end - 1 (absolute); key tile nt is ring position gb + nt.
    const int n_first = first_key_tile<NC>(a, t.m_block), n_end = key_tiles<NC>(a, t.m_block);
    if (n_end <= n_first) continue;
    const int gb = g0 - n_first;
    const int hk = t.h / a.group;
    // The previous work tile's Q is free once every consumer warp's last S GEMM is done.
    mbar_wait(smem_u32(&sh.q_empty), (qi & 1) ^ 1);
    mbar_expect_tx(smem_u32(&sh.q_full), kQBytes);
    for (int p = 0; p < kPanels; ++p)
      load_tile(smem_u32(&sh.q[p][0]), tm_q, smem_u32(&sh.q_full), 64 * p, t.h, t.m_block * kBM, t.b, false);
    ++qi;
    // Order K0, K1, V0, K2, V1, ...: K of the next tile before V of this one, so the next
    // S GEMM's operand is never queued behind a V slot that the P V GEMM still holds (the
    // overlapped consumer reads K_{n+1} before V_n).
    load_kv(sh, sh.k, sh.k_full, sh.k_empty, tm_k, gb, n_first, hk, t.b);
    for (int nt = n_first; nt < n_end; ++nt) {
      if (nt + 1 < n_end) load_kv(sh, sh.k, sh.k_full, sh.k_empty, tm_k, gb, nt + 1, hk, t.b);
      load_kv(sh, sh.v, sh.v_full, sh.v_empty, tm_v, gb, nt, hk, t.b);
    }
    g0 = gb + n_end;
  }
}

// ------------------------------------------------------------------ consumers
// Ping-pong: the consumers issue their GEMM phases in turn, cw = 0, 1, .., NC-1, 0, ..., over
// all work tiles of the CTA (one ring: the order never restarts, so no consumer can run two
// phases ahead of another at a tile boundary). Consumer cw waits on named barrier 1 + cw and
// passes to 1 + (cw + 1) % NC, 256 threads each (one warpgroup syncs, one arrives). Consumer 0
// does not wait before the CTA's first phase; after the last one it takes the token once more
// (finish), so barrier 1 sees as many syncs as arrivals and no barrier is left half-arrived
// when the CTA exits.
template <int NC>
struct PingPongToken {
  int cw;
  bool first_phase = true;
  __device__ __forceinline__ void take() {
    if (cw != 0 || !first_phase) named_bar_sync(1 + cw, 256);
    first_phase = false;
  }
  __device__ __forceinline__ void pass() { named_bar_arrive(1 + (cw + 1) % NC, 256); }
  __device__ __forceinline__ void finish() {
    if (cw == 0 && !first_phase) named_bar_sync(1, 256);
  }
};

// A consumer's view of the K/V ring for one work tile (ring positions g0 + n, n < n_end).
template <int HD, int NC>
struct KvRing {
  FwdSmem<HD, NC>& sh;
  int g0, n_end, lane;
  __device__ __forceinline__ uint32_t k_addr(int n) const { return smem_u32(&sh.k[(g0 + n) % kStages][0][0]); }
  __device__ __forceinline__ uint32_t v_addr(int n) const { return smem_u32(&sh.v[(g0 + n) % kStages][0][0]); }
  __device__ __forceinline__ void wait_k(int n) const {
    mbar_wait(smem_u32(&sh.k_full[(g0 + n) % kStages]), ((g0 + n) / kStages) & 1);
  }
  __device__ __forceinline__ void wait_v(int n) const {
    mbar_wait(smem_u32(&sh.v_full[(g0 + n) % kStages]), ((g0 + n) / kStages) & 1);
  }
  // Every warp releases a slot once its own wait_group has returned (NC * 4 arrivals complete
  // it); after the last S GEMM of the work tile the Q buffer too.
  __device__ __forceinline__ void free_k(int n) const {
    __syncwarp();
    if (lane == 0) {
      mbar_arrive(smem_u32(&sh.k_empty[(g0 + n) % kStages]));
      if (n == n_end - 1) mbar_arrive(smem_u32(&sh.q_empty));
    }
  }
  __device__ __forceinline__ void free_v(int n) const {
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_u32(&sh.v_empty[(g0 + n) % kStages]));
  }
};

// The rows a thread owns in a work tile and what they see (few registers: the consumers have
// none to spare).
struct RowMask {
  int m0;      // the tile's first row
  int kbase;   // the first key loaded (a sliding window skips the tiles before n_first)
  int lim[2];  // last visible key of rows row0 (half 0) and row0 + 8 (half 1)
  int first;   // first visible key of row0, in [-8, Sk] (-8 without a window); row0 + 8's: first + 8
};

// -inf on the keys of the n-th loaded tile (keys kbase + 128 n ..) that a row does not see (only
// tiles that cross Sk, the diagonal or the window's left edge).
template <int NC>
__device__ __forceinline__ void mask_tile(float (&s)[64], int n, const FwdArgs& a, const RowMask& rm) {
  const int k0 = rm.kbase + n * kBlockN;
  const bool need_mask = k0 + kBlockN > a.sk || (a.causal && k0 + kBlockN - 1 > rm.m0 + a.diag) ||
                         (a.windowed && k0 <= static_cast<long long>(rm.m0) + 64 * NC - 1 + a.wdiag);
  if (!need_mask) return;
  const int key0 = k0 + 2 * (threadIdx.x % 4);  // this thread's first column in each 8-column chunk
#pragma unroll
  for (int c8 = 0; c8 < kBlockN / 8; ++c8)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int key = key0 + 8 * c8 + j;
        if (key > rm.lim[hf] || key < rm.first + 8 * hf) s[4 * c8 + 2 * hf + j] = -INFINITY;
      }
}

// The GEMMs and softmax of one work tile (n_end >= 1 key tiles) into o, m_run, l_run.
// The softmax of tile n runs while the tensor cores do P_{n-1} V_{n-1} (FA3's intra-warpgroup
// overlap): issue S_n = Q K_n^T, then O += P_{n-1} V_{n-1}; wait for the older group (S_n)
// only; softmax S_n; wait for the P V group. Tile n's correction is kept until the next phase
// and O rescaled there, after issuing S_{n+1} and before issuing P_n V_n, so the FMULs run
// while the tensor cores do S_{n+1} instead of between two issues (FA3's order). Each phase's
// issues sit between token.take() and token.pass() (ping-pong).
template <int HD, int NC>
__device__ __forceinline__ void consumer_mainloop(const KvRing<HD, NC>& ring, PingPongToken<NC>& token,
                                                  const FwdArgs& a, const RowMask& rm, uint32_t q_base,
                                                  float (&o)[HD / 2], float (&m_run)[2], float (&l_run)[2]) {
  constexpr uint32_t kPanelBytesQ = 64 * NC * kRowBytes;  // one 64-column panel of the Q tile
  const int n_end = ring.n_end;
  float corr[2];
  uint32_t p[kBlockN / 16][4];
  {
    float s[64];
    ring.wait_k(0);
    token.take();
    wgmma_fence();
    gemm_qk<HD>(s, q_base, kPanelBytesQ, ring.k_addr(0));
    wgmma_commit();
    token.pass();
    wgmma_wait<0>();
    reg_fence(s);
    ring.free_k(0);
    mask_tile<NC>(s, 0, a, rm);
    online_softmax(s, m_run, l_run, corr, a.scale_log2);  // O is 0: corr (0) changes nothing
    s_to_p(s, p);
  }
  for (int n = 1; n < n_end; ++n) {
    float s[64];
    ring.wait_k(n);
    ring.wait_v(n - 1);
    token.take();
    reg_fence(o);
    reg_fence(p);
    wgmma_fence();
    gemm_qk<HD>(s, q_base, kPanelBytesQ, ring.k_addr(n));
    wgmma_commit();
    reg_fence(o);          // the FMULs below stay after the S issue
    rescale<HD>(o, corr);  // tile n-1's correction: O (tiles < n-1) to m_{n-1}
    reg_fence(o);
    wgmma_fence();  // O was written by ordinary instructions since the last wgmma
    gemm_pv<HD>(o, p, ring.v_addr(n - 1));
    wgmma_commit();
    token.pass();
    wgmma_wait<1>();  // groups complete in order: S_n is done, P_{n-1} V_{n-1} may not be
    reg_fence(s);
    ring.free_k(n);
    mask_tile<NC>(s, n, a, rm);
    online_softmax(s, m_run, l_run, corr, a.scale_log2);
    wgmma_wait<0>();
    reg_fence(o);
    reg_fence(p);
    ring.free_v(n - 1);
    s_to_p(s, p);
  }
  rescale<HD>(o, corr);  // the last tile's correction (O is complete)
  ring.wait_v(n_end - 1);
  token.take();
  reg_fence(o);
  reg_fence(p);
  wgmma_fence();
  gemm_pv<HD>(o, p, ring.v_addr(n_end - 1));
  wgmma_commit();
  token.pass();
  wgmma_wait<0>();
  reg_fence(o);
  reg_fence(p);
  ring.free_v(n_end - 1);
}

// ------------------------------------------------------------------ epilogue
// o = O / l straight from registers (bf16x2 stores), lse = (m*scale_log2 + log2 l) * ln 2.
// (Persistent CTAs: the producer is already loading the next work tile's Q and K/V.)
template <int HD>
__device__ __forceinline__ void epilogue(const FwdArgs& a, const Tile& t, int row0, int colq, int lane,
                                         const float (&o)[HD / 2], const float (&m_run)[2], const float (&l_run)[2]) {
  constexpr float kLn2 = 0.6931471805599453f;
  const int h = t.h, b = t.b;
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

// Consumer warpgroup wg (1 .. NC), 64 query rows of every work tile of the CTA.
template <int HD, int NC, bool kPersist>
__device__ __forceinline__ void consumer(FwdSmem<HD, NC>& sh, const FwdArgs& a, int wg, int tid) {
  constexpr int kBM = 64 * NC;  // query rows per work tile
  const int cw = wg - 1, warp = tid / 32, lane = tid % 32;
  const int colq = 2 * (lane % 4);  // this thread's first column in each 8-column chunk
  const uint32_t q_base = smem_u32(&sh.q[0][0]) + cw * 64 * kRowBytes;  // 8 KiB: a multiple of 1024
  PingPongToken<NC> token{cw};
  int g0 = 0, qi = 0;
  for (int r = 0;; ++r) {
    Tile t;
    if (!next_tile<kPersist, false>(sh, a, r, lane, t)) break;
    const int m0 = t.m_block * kBM;
    const int n_first = first_key_tile<NC>(a, t.m_block);
    const int n_end = key_tiles<NC>(a, t.m_block) - n_first;  // key tiles loaded
    const int row0 = m0 + cw * 64 + warp * 16 + lane / 4;     // this thread's rows: row0 (half 0), row0 + 8 (half 1)
    const long long first = static_cast<long long>(row0) + a.wdiag + 1;  // (64-bit: no overflow)
    // (Without a window -8, not 0: row0 + 8's bound is first + 8, which must hide no key.)
    RowMask rm{m0, n_first * kBlockN, {}, a.windowed ? static_cast<int>(min(max(first, -8ll), 1ll * a.sk)) : -8};
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) rm.lim[hf] = a.causal ? min(row0 + 8 * hf + a.diag, a.sk - 1) : a.sk - 1;

    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

    if (n_end > 0) {
      mbar_wait(smem_u32(&sh.q_full), qi & 1);
      const KvRing<HD, NC> ring{sh, g0, n_end, lane};
      consumer_mainloop<HD, NC>(ring, token, a, rm, q_base, o, m_run, l_run);
      g0 += n_end;
      ++qi;
    }
    epilogue<HD>(a, t, row0, colq, lane, o, m_run, l_run);
  }
  token.finish();
}

// NC consumer warpgroups (2, or 3 for hd 64's wide tiles); kPersist: persistent CTAs walking
// the tile list.
template <int HD, int NC, bool kPersist>
__global__ void __launch_bounds__(128 * (1 + NC), 1)
    attention_fwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                              const __grid_constant__ CUtensorMap tm_v, const FwdArgs a) {
  static_assert(NC == 2 || (NC == 3 && HD == 64), "3 consumers: hd 64 only");
  static_assert(kProducerRegs<kPersist> + NC * kConsumerRegs<NC, kPersist> <= 504,
                "setmaxnreg beyond the launch allocation (168 registers x 3 warpgroups) never returns");
  extern __shared__ unsigned char smem_raw[];
  FwdSmem<HD, NC>& sh = aligned_smem<FwdSmem<HD, NC>>(smem_raw);
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (threadIdx.x == 0) init_barriers(sh);
  __syncthreads();
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs<kPersist>) : "memory");
    if (tid == 0) producer<HD, NC, kPersist>(sh, &tm_q, &tm_k, &tm_v, a);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs<NC, kPersist>) : "memory");
  consumer<HD, NC, kPersist>(sh, a, wg, tid);
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
__global__ void __launch_bounds__(128)
    wgmma_tile_check_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                            const __grid_constant__ CUtensorMap tm_v, float* s_out, float* o_out, int swap_v_offsets) {
  extern __shared__ unsigned char smem_raw[];
  TileSmem<HD>& sh = aligned_smem<TileSmem<HD>>(smem_raw);
  constexpr int kPanels = HD / 64;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const uint32_t bar = smem_u32(&sh.bar);
  init_one_barrier(bar);
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
  store_acc(s_out, s, row0, colq, kBlockN);

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
  else gemm_pv<HD>(o, p, smem_u32(&sh.v[0][0]));
  wgmma_commit();
  wgmma_wait<0>();
  reg_fence(o);
  reg_fence(p);
  store_acc(o_out, o, row0, colq, HD);
}

// ------------------------------------------------------------------ host side
constexpr unsigned kTileCounters = 64;
std::atomic<int64_t> g_l2_section_bytes{0};     // sm90_set_l2_section_bytes (0: 32 MiB)
__device__ int g_tile_counters[kTileCounters];  // the persistent kernel's work counters (launch_fwd)

template <int HD, int NC, bool kPersist>
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
  a.windowed = p.window > 0 ? 1 : 0;
  a.wdiag = static_cast<int>(std::max<int64_t>(-(p.sq + 1), std::min<int64_t>(p.diag - p.window, p.sk + 1)));
  a.scale_log2 = p.scale_log2;
  const int64_t m_blocks = (p.sq + kBM - 1) / kBM, tiles = m_blocks * p.hq * p.batch;
  if (kPersist && tiles > (int64_t{1} << 31) - 1)
    EASYCTX_THROW("attention_fwd_sm90: ", tiles, " work tiles do not fit the persistent kernel's int counter");
  a.m_blocks = static_cast<int>(m_blocks);
  a.batch = static_cast<int>(p.batch);
  a.tiles = static_cast<int>(std::min<int64_t>(tiles, (int64_t{1} << 31) - 1));
  auto kernel = attention_fwd_sm90_kernel<HD, NC, kPersist>;
  const size_t smem = sizeof(FwdSmem<HD, NC>) + 1024;
  static_assert(sizeof(FwdSmem<HD, NC>) + 1024 <= 227 * 1024, "over the 227 KB of shared memory a CTA may have");
  EASYCTX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  dim3 grid(static_cast<unsigned>(m_blocks), static_cast<unsigned>(p.hq), static_cast<unsigned>(p.batch));
  if constexpr (kPersist) {
    // One CTA per SM (the shared memory and registers allow no second one), each taking work
    // tiles of the list (tile_of) until it is used up.
    grid = dim3(static_cast<unsigned>(std::min<int64_t>(tiles, std::max(current_device_sms(), 1))), 1, 1);
    // L2 sections: as many kv heads as fit 32 MB of K + V (at least one), times the GQA group
    // (the q heads that read them); sections never straddle a kv group.
    const int64_t kv_bytes = p.sk * HD * 2 * 2, budget = g_l2_section_bytes.load(std::memory_order_relaxed);
    const int64_t kv_heads =
        std::max<int64_t>(1, (budget > 0 ? budget : int64_t{32} << 20) / std::max<int64_t>(kv_bytes, 1));
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
void launch_tile_check(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, float* s_out,
                       float* o_out, int swap, cudaStream_t st) {
  const CUtensorMap tq = make_map(q, HD, 64, 1, 1, HD, 64 * HD, 64, "q");
  const CUtensorMap tk = make_map(k, HD, kBlockN, 1, 1, HD, kBlockN * HD, kBlockN, "k");
  const CUtensorMap tv = make_map(v, HD, kBlockN, 1, 1, HD, kBlockN * HD, kBlockN, "v");
  const size_t smem = sizeof(TileSmem<HD>) + 1024;
  EASYCTX_CUDA_CHECK(cudaFuncSetAttribute(wgmma_tile_check_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
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

void attention_fwd_sm90(const AttentionParams& p, cudaStream_t st, Sm90FwdVariant variant) {
  std::string why;
  if (!attention_fwd_sm90_supported(p, &why)) EASYCTX_THROW("attention_fwd_sm90: unsupported call: ", why);
  variant = sm90_fwd_resolve(variant, p.hd);
  if (!sm90_fwd_variant_supported(variant, p.hd))
    EASYCTX_THROW("attention_fwd_sm90: variant ", sm90_fwd_variant_name(variant), " does not support head dim ", p.hd);
  switch (variant) {
    case Sm90FwdVariant::Persistent: return sm90::launch_fwd<128, 2, true>(p, st);
    case Sm90FwdVariant::Wide: return sm90::launch_fwd<64, 3, false>(p, st);
    case Sm90FwdVariant::Auto: break;
  }
  EASYCTX_THROW("attention_fwd_sm90: unknown variant ", static_cast<int>(variant));
}

void sm90_set_l2_section_bytes(int64_t bytes) { sm90::g_l2_section_bytes.store(bytes, std::memory_order_relaxed); }

std::string sm90_take_hang_report() { return sm90::take_hang_report(); }

void sm90_wgmma_tile_check(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int hd, float* s_out,
                           float* o_out, cudaStream_t st, bool swap_v_offsets) {
  if (!sm90_device_available()) EASYCTX_THROW("sm90_wgmma_tile_check: the current device is not sm_90");
  if (hd != 64 && hd != 128) EASYCTX_THROW("sm90_wgmma_tile_check: hd must be 64 or 128, got ", hd);
  if (!sm90::aligned16(q) || !sm90::aligned16(k) || !sm90::aligned16(v))
    EASYCTX_THROW("sm90_wgmma_tile_check: q, k, v must be 16-byte aligned");
  if (hd == 128) sm90::launch_tile_check<128>(q, k, v, s_out, o_out, swap_v_offsets ? 1 : 0, st);
  else sm90::launch_tile_check<64>(q, k, v, s_out, o_out, swap_v_offsets ? 1 : 0, st);
}

}  // namespace easyctx::kernels
