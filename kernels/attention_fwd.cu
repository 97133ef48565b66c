// Attention forward, FlashAttention-2 style (mma.sync bf16, fp32 accumulators, online
// softmax in base 2), with LSE output for ring merges and the causal offsets of a block.
//   q [B, Sq, Hq, hd], k/v [B, Sk, Hkv, hd], o [B, Sq, Hq, hd], lse f32[B, Hq, Sq]
//   FLOPs: 4 B Hq Sq Sk hd (halved by causal masking); bytes: q + o once, k/v once per
//   query tile (mostly from L2:
//   2 x 64 keys x hd x 2 bytes per 4 x 16 NW x 64 x hd FLOPs = 16 NW FLOP/byte of L2 traffic).
// Grid (Sq/(16 NW), B*Hq); NW warps (8 for hd 128, 4 for hd 64), each owning 16 query
// rows; K/V tiles of 64 keys are double-buffered with cp.async. Query tiles run in reverse so causal's long rows go first.
// A sliding window starts each query tile's key loop at the first tile its window reaches.
#include "kernels/attention.h"
#include "kernels/common.cuh"
#include "kernels/mma.cuh"

namespace easyctx::kernels {
namespace {

using namespace mma;
constexpr int kBN = 64;  // keys per tile

// NW warps of 16 query rows each: kBM = 16 NW rows share every K/V tile. Measured on H200
// (bench/RESULTS.md): 8 warps pay for hd 128 (180 -> 206 TFLOP/s), 4 warps are better for
// hd 64 (169 vs 136).
template <int HD, int NW>
constexpr int fwd_smem_bytes() {
  return (16 * NW * HD + 4 * kBN * HD) * 2;  // Q + 2 x (K, V)
}

template <int HD, int NW>
__global__ void __launch_bounds__(NW * 32) attention_fwd_kernel(const AttentionParams p) {
  constexpr int kThreads = NW * 32;
  constexpr int kBM = NW * 16;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [kBM][HD]
  __nv_bfloat16* sK = sQ + kBM * HD;                               // [2][kBN][HD]
  __nv_bfloat16* sV = sK + 2 * kBN * HD;                           // [2][kBN][HD]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t m_block = gridDim.x - 1 - blockIdx.x;
  const int64_t b = blockIdx.y / p.hq, h = blockIdx.y % p.hq, g = h / (p.hq / p.hkv);
  const int64_t i0 = m_block * kBM;
  const __nv_bfloat16* qb = p.q + b * p.q_batch + h * HD;
  const __nv_bfloat16* kb = p.k + b * p.k_batch + g * HD;
  const __nv_bfloat16* vb = p.v + b * p.k_batch + g * HD;

  int64_t kend = p.sk;  // keys [kbeg, kend) can be visible to some row of this tile
  if (p.causal) kend = min(kend, i0 + kBM + p.diag);
  const int ntiles = kend > 0 ? static_cast<int>(CEIL_DIV(kend, int64_t(kBN))) : 0;
  // The sliding window: the tile's first row sees no key at or before i0 + diag - window, nor
  // does any later row; tiles t0.. (absolute indices, so the double buffer's parity holds).
  const int64_t kbeg = p.window > 0 ? max(int64_t(0), i0 + p.diag - p.window + 1) : 0;
  const int t0 = static_cast<int>(min(kbeg / kBN, int64_t(ntiles)));

  load_tile<kBM, HD, kThreads>(sQ, qb, p.q_row, i0, p.sq);
  if (ntiles > t0) {
    load_tile<kBN, HD, kThreads>(sK + (t0 & 1) * kBN * HD, kb, p.k_row, int64_t(t0) * kBN, p.sk);
    load_tile<kBN, HD, kThreads>(sV + (t0 & 1) * kBN * HD, vb, p.k_row, int64_t(t0) * kBN, p.sk);
  }
  cp_async_commit();

  float acc[HD / 8][4];
#pragma unroll
  for (int d = 0; d < HD / 8; ++d) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.f;
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
  uint32_t qf[HD / 16][4];

  for (int t = t0; t < ntiles; ++t) {
    kv_stream_step<kBN, HD, kThreads>(sK, sV, kb, vb, p.k_row, p.sk, t, ntiles);
    if (t == t0) {
#pragma unroll
      for (int ks = 0; ks < HD / 16; ++ks) ldmatrix_x4(qf[ks], frag_a<HD>(sQ, warp * 16, ks * 16, lane));
    }
    const __nv_bfloat16* cK = sK + (t & 1) * kBN * HD;
    const __nv_bfloat16* cV = sV + (t & 1) * kBN * HD;

    // S = Q K^T for this warp's 16 rows x 64 keys.
    float s[kBN / 8][4];
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks) {
#pragma unroll
      for (int np = 0; np < kBN / 16; ++np) {
        uint32_t bfr[4];
        ldmatrix_x4(bfr, frag_b_nk<HD>(cK, np * 16, ks * 16, lane));
        mma_bf16(s[2 * np], qf[ks], bfr[0], bfr[1]);
        mma_bf16(s[2 * np + 1], qf[ks], bfr[2], bfr[3]);
      }
    }
    // Scale to base 2 and mask (only tiles that cross the diagonal, the window's left edge or
    // the end of the keys).
    const int64_t j0 = int64_t(t) * kBN;
    const bool need_mask = (j0 + kBN > p.sk) || (p.causal && j0 + kBN - 1 > i0 + p.diag) ||
                           (p.window > 0 && j0 <= i0 + kBM - 1 + p.diag - p.window);
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[n][e] * p.scale_log2;
        if (need_mask) {
          const int64_t i = i0 + warp * 16 + (lane >> 2) + ((e >> 1) << 3);
          const int64_t j = j0 + n * 8 + ((lane & 3) << 1) + (e & 1);
          if (j >= p.sk || (p.causal && j > i + p.diag) || (p.window > 0 && j <= i + p.diag - p.window)) x = -INFINITY;
        }
        s[n][e] = x;
      }
    }
    // Online softmax; each thread holds 2 rows (lane/4 and lane/4 + 8), a quad shares a row.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = mrow[r];
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float base = mx == -INFINITY ? 0.f : mx;  // a fully masked row so far: keep zeros
      const float corr = exp2f(mrow[r] - base);
      mrow[r] = mx;
      float rs = 0.f;
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n) {
        s[n][2 * r] = exp2f(s[n][2 * r] - base);
        s[n][2 * r + 1] = exp2f(s[n][2 * r + 1] - base);
        rs += s[n][2 * r] + s[n][2 * r + 1];
      }
      lrow[r] = lrow[r] * corr + rs;
#pragma unroll
      for (int d = 0; d < HD / 8; ++d) {
        acc[d][2 * r] *= corr;
        acc[d][2 * r + 1] *= corr;
      }
    }
    // O += P V: the S accumulators of two adjacent n8 tiles form one A fragment.
#pragma unroll
    for (int ks = 0; ks < kBN / 16; ++ks) {
      uint32_t a[4];
      acc_to_a(s, ks, a);
      mma_a_bkn<HD>(acc, a, cV, ks * 16, lane);
    }
    __syncthreads();  // this buffer is refilled by the next iteration's prefetch
  }
  cp_async_wait<0>();

  __nv_bfloat16* ob = p.o_out + b * p.q_batch + h * HD;
  float* lb = p.lse_out + (b * p.hq + h) * p.sq;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = lrow[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int64_t i = i0 + warp * 16 + (lane >> 2) + r * 8;
    if (i >= p.sq) continue;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    __nv_bfloat16* orow = ob + i * p.q_row;
#pragma unroll
    for (int d = 0; d < HD / 8; ++d)
      *reinterpret_cast<uint32_t*>(orow + d * 8 + ((lane & 3) << 1)) =
          pack_bf16(acc[d][2 * r] * inv, acc[d][2 * r + 1] * inv);
    if ((lane & 3) == 0) lb[i] = l > 0.f ? (mrow[r] + log2f(l)) * 0.69314718055994531f : -INFINITY;
  }
}

template <int HD, int NW>
void launch_fwd(const AttentionParams& p, cudaStream_t st) {
  constexpr int smem = fwd_smem_bytes<HD, NW>();
  EASYCTX_CUDA_CHECK(
      cudaFuncSetAttribute(attention_fwd_kernel<HD, NW>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  dim3 grid(static_cast<unsigned>(CEIL_DIV(p.sq, int64_t(16 * NW))), static_cast<unsigned>(p.batch * p.hq));
  attention_fwd_kernel<HD, NW><<<grid, NW * 32, smem, st>>>(p);
  EASYCTX_CUDA_CHECK_LAUNCH("attention_fwd_kernel");
}

}  // namespace

void attention_fwd(const AttentionParams& p, cudaStream_t st) {
  if (p.sq == 0 || p.batch == 0 || p.hq == 0) return;
  switch (p.hd) {
    case 64: launch_fwd<64, 4>(p, st); break;
    case 128: launch_fwd<128, 8>(p, st); break;
    default: EASYCTX_THROW("attention_fwd (CUDA): head dim ", p.hd, " not supported (64 or 128)");
  }
}

}  // namespace easyctx::kernels
