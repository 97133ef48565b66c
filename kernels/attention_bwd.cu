// Attention backward, FlashAttention-2 style but deterministic (no atomics): three kernels.
//   1. delta[b,h,i] = sum_c dout[b,i,h,c] o[b,i,h,c]                      (fp32)
//   2. dK, dV: a block owns 64 keys of one kv head and loops over every query row of the
//      heads of its GQA group that can see them (32 rows a step), so it alone writes them:
//        S^T = K Q^T, P^T = exp(S^T - lse), dP^T = V dO^T, dS^T = P^T (dP^T - delta),
//        dV += P^T dO, dK += scale dS^T Q                                 (4 matmuls)
//   3. dQ: a block owns 64 query rows and loops over their visible keys (64 a step):
//        S = Q K^T, dP = dO V^T, dS = P (dP - delta), dQ += scale dS K    (3 matmuls)
//   A sliding window (p.window) narrows both loops to the rows / keys it leaves visible.
//   Shapes as attention_fwd; FLOPs: 7 x 2 B Hq Sq Sk hd (halved by causal masking), i.e.
//   1.4x the 5-matmul count that the usual "bwd = 2.5 x fwd" convention credits; the price
//   of summing every gradient in a fixed order. dq, dk, dv are accumulated (+=) in fp32
//   and stored in bf16.
#include "kernels/attention.h"
#include "kernels/common.cuh"
#include "kernels/mma.cuh"

namespace easyctx::kernels {
namespace {

using namespace mma;
constexpr int kThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;

// ---- 1. delta = rowsum(dout * o); one warp per (b, i, h) row.
__global__ void attention_bwd_delta_kernel(const AttentionParams p) {
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= p.batch * p.sq * p.hq) return;
  const int64_t b = row / (p.sq * p.hq), i = (row / p.hq) % p.sq, h = row % p.hq;
  const int64_t off = b * p.q_batch + i * p.q_row + h * p.hd;
  float s = 0.f;
  for (int64_t c = lane; c < p.hd; c += 32) s += to_float(p.dout[off + c]) * to_float(p.o[off + c]);
  s = warp_sum(s);
  if (lane == 0) p.delta[(b * p.hq + h) * p.sq + i] = s;
}

// lse in base 2, with rows that can contribute nothing (past the end, or no visible key at
// all: lse = -inf) mapped to +inf so that exp2(s - L) = 0.
__device__ __forceinline__ float lse2_of(const AttentionParams& p, int64_t b, int64_t h, int64_t i) {
  if (i >= p.sq) return INFINITY;
  const float l = p.lse[(b * p.hq + h) * p.sq + i];
  return l == -INFINITY ? INFINITY : l * kLog2e;
}

// ---- 2. dK, dV
constexpr int kKvBN = 64;  // keys per block (4 warps x 16)
constexpr int kKvBM = 32;  // query rows per step

template <int HD>
constexpr int dkdv_smem_bytes() {
  return (2 * kKvBN * HD + 4 * kKvBM * HD) * 2 + 4 * kKvBM * 4;
}

template <int HD>
__global__ void __launch_bounds__(kThreads) attention_bwd_dkdv_kernel(const AttentionParams p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* sK = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [kKvBN][HD]
  __nv_bfloat16* sV = sK + kKvBN * HD;                             // [kKvBN][HD]
  __nv_bfloat16* sQ = sV + kKvBN * HD;                             // [2][kKvBM][HD]
  __nv_bfloat16* sdO = sQ + 2 * kKvBM * HD;                        // [2][kKvBM][HD]
  float* sL = reinterpret_cast<float*>(sdO + 2 * kKvBM * HD);      // [2][kKvBM] lse (base 2)
  float* sD = sL + 2 * kKvBM;                                      // [2][kKvBM] delta
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t b = blockIdx.y / p.hkv, g = blockIdx.y % p.hkv, group = p.hq / p.hkv;
  const int64_t j0 = int64_t(blockIdx.x) * kKvBN;
  // First query row that can see key j0; rows before it see none of this block's keys. With a
  // sliding window, rows from iend on see none either (their window starts after the last key).
  const int64_t ibeg = p.causal ? max(int64_t(0), j0 - p.diag) : 0;
  const int64_t iend = p.window > 0 ? min(p.sq, min(j0 + kKvBN, p.sk) - 1 - p.diag + p.window) : p.sq;
  if (ibeg >= iend) return;  // no query sees these keys: nothing to add
  const int64_t qt0 = ibeg / kKvBM, nq = CEIL_DIV(iend, int64_t(kKvBM)) - qt0;
  const int64_t steps = group * nq;

  const __nv_bfloat16* kb = p.k + b * p.k_batch + g * HD;
  const __nv_bfloat16* vb = p.v + b * p.k_batch + g * HD;
  load_tile<kKvBN, HD, kThreads>(sK, kb, p.k_row, j0, p.sk);
  load_tile<kKvBN, HD, kThreads>(sV, vb, p.k_row, j0, p.sk);

  auto load_step = [&](int64_t s, int buf) {
    const int64_t h = g * group + s / nq, qi0 = (qt0 + s % nq) * kKvBM;
    const int64_t off = b * p.q_batch + h * HD;
    load_tile<kKvBM, HD, kThreads>(sQ + buf * kKvBM * HD, p.q + off, p.q_row, qi0, p.sq);
    load_tile<kKvBM, HD, kThreads>(sdO + buf * kKvBM * HD, p.dout + off, p.q_row, qi0, p.sq);
    if (tid < kKvBM) {
      const int64_t i = qi0 + tid;
      sL[buf * kKvBM + tid] = lse2_of(p, b, h, i);
      sD[buf * kKvBM + tid] = i < p.sq ? p.delta[(b * p.hq + h) * p.sq + i] : 0.f;
    }
  };
  load_step(0, 0);
  cp_async_commit();

  float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
  for (int d = 0; d < HD / 8; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[d][e] = dv[d][e] = 0.f;

  for (int64_t s = 0; s < steps; ++s) {
    const int buf = s & 1;
    if (s + 1 < steps) load_step(s + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const __nv_bfloat16* cQ = sQ + buf * kKvBM * HD;
    const __nv_bfloat16* cdO = sdO + buf * kKvBM * HD;
    const float* cL = sL + buf * kKvBM;
    const float* cD = sD + buf * kKvBM;
    const int64_t qi0 = (qt0 + s % nq) * kKvBM;

    // S^T = K Q^T and dP^T = V dO^T: this warp's 16 keys x 32 query rows.
    float st[kKvBM / 8][4], dpt[kKvBM / 8][4];
    mma_pair_nt<HD, kKvBM>(st, dpt, sK, sV, cQ, cdO, warp * 16, lane);
    // P^T and dS^T in place (element e: key row lane/4 (+8), query column 2*(lane%4) (+1)).
    const bool need_mask = (j0 + kKvBN > p.sk) || (p.causal && j0 + kKvBN - 1 > qi0 + p.diag) ||
                           (p.window > 0 && j0 <= qi0 + kKvBM - 1 + p.diag - p.window);
#pragma unroll
    for (int n = 0; n < kKvBM / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = n * 8 + ((lane & 3) << 1) + (e & 1);
        float pv = exp2f(st[n][e] * p.scale_log2 - cL[qc]);
        if (need_mask) {
          const int64_t j = j0 + warp * 16 + (lane >> 2) + ((e >> 1) << 3), i = qi0 + qc;
          if (j >= p.sk || (p.causal && j > i + p.diag) || (p.window > 0 && j <= i + p.diag - p.window)) pv = 0.f;
        }
        st[n][e] = pv;
        dpt[n][e] = pv * (dpt[n][e] - cD[qc]);
      }
    }
    // dV += P^T dO, dK += dS^T Q (k = the 32 query rows).
#pragma unroll
    for (int ks = 0; ks < kKvBM / 16; ++ks) {
      uint32_t ap[4], as[4];
      acc_to_a(st, ks, ap);
      acc_to_a(dpt, ks, as);
      mma_a_bkn<HD>(dv, ap, cdO, ks * 16, lane);
      mma_a_bkn<HD>(dk, as, cQ, ks * 16, lane);
    }
    __syncthreads();
  }
  cp_async_wait<0>();

  __nv_bfloat16* dkb = p.dk + b * p.k_batch + g * HD;
  __nv_bfloat16* dvb = p.dv + b * p.k_batch + g * HD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t j = j0 + warp * 16 + (lane >> 2) + r * 8;
    if (j >= p.sk) continue;
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) {
      const int64_t c = j * p.k_row + d * 8 + ((lane & 3) << 1);
      __nv_bfloat162 ok = *reinterpret_cast<__nv_bfloat162*>(dkb + c);
      __nv_bfloat162 ov = *reinterpret_cast<__nv_bfloat162*>(dvb + c);
      *reinterpret_cast<uint32_t*>(dkb + c) =
          pack_bf16(__low2float(ok) + p.scale * dk[d][2 * r], __high2float(ok) + p.scale * dk[d][2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dvb + c) =
          pack_bf16(__low2float(ov) + dv[d][2 * r], __high2float(ov) + dv[d][2 * r + 1]);
    }
  }
}

// ---- 3. dQ
constexpr int kDqThreads = 128;
constexpr int kQBM = 64;  // query rows per block (4 warps x 16; 8 warps measured no faster)
constexpr int kQBN = 64;  // keys per step

template <int HD>
constexpr int dq_smem_bytes() {
  return (2 * kQBM * HD + 4 * kQBN * HD) * 2;
}

template <int HD>
__global__ void __launch_bounds__(kDqThreads) attention_bwd_dq_kernel(const AttentionParams p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [kQBM][HD]
  __nv_bfloat16* sdO = sQ + kQBM * HD;                             // [kQBM][HD]
  __nv_bfloat16* sK = sdO + kQBM * HD;                             // [2][kQBN][HD]
  __nv_bfloat16* sV = sK + 2 * kQBN * HD;                          // [2][kQBN][HD]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t m_block = gridDim.x - 1 - blockIdx.x;
  const int64_t b = blockIdx.y / p.hq, h = blockIdx.y % p.hq, g = h / (p.hq / p.hkv);
  const int64_t i0 = m_block * kQBM;
  int64_t kend = p.sk;
  if (p.causal) kend = min(kend, i0 + kQBM + p.diag);
  // The sliding window: key tiles before t0 lie wholly before every row's window (absolute
  // tile indices, so the double buffer's parity holds).
  const int64_t kbeg = p.window > 0 ? max(int64_t(0), i0 + p.diag - p.window + 1) : 0;
  if (kend <= kbeg) return;  // no row of this tile sees a key: dq unchanged
  const int ntiles = static_cast<int>(CEIL_DIV(kend, int64_t(kQBN)));
  const int t0 = static_cast<int>(kbeg / kQBN);

  const int64_t qoff = b * p.q_batch + h * HD;
  const __nv_bfloat16* kb = p.k + b * p.k_batch + g * HD;
  const __nv_bfloat16* vb = p.v + b * p.k_batch + g * HD;
  load_tile<kQBM, HD, kDqThreads>(sQ, p.q + qoff, p.q_row, i0, p.sq);
  load_tile<kQBM, HD, kDqThreads>(sdO, p.dout + qoff, p.q_row, i0, p.sq);
  load_tile<kQBN, HD, kDqThreads>(sK + (t0 & 1) * kQBN * HD, kb, p.k_row, int64_t(t0) * kQBN, p.sk);
  load_tile<kQBN, HD, kDqThreads>(sV + (t0 & 1) * kQBN * HD, vb, p.k_row, int64_t(t0) * kQBN, p.sk);
  cp_async_commit();

  float lrow[2], drow[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = i0 + warp * 16 + (lane >> 2) + r * 8;
    lrow[r] = lse2_of(p, b, h, i);
    drow[r] = i < p.sq ? p.delta[(b * p.hq + h) * p.sq + i] : 0.f;
  }
  float dq[HD / 8][4];
#pragma unroll
  for (int d = 0; d < HD / 8; ++d) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.f;

  for (int t = t0; t < ntiles; ++t) {
    kv_stream_step<kQBN, HD, kDqThreads>(sK, sV, kb, vb, p.k_row, p.sk, t, ntiles);
    const __nv_bfloat16* cK = sK + (t & 1) * kQBN * HD;
    const __nv_bfloat16* cV = sV + (t & 1) * kQBN * HD;

    float s[kQBN / 8][4], dp[kQBN / 8][4];
    mma_pair_nt<HD, kQBN>(s, dp, sQ, sdO, cK, cV, warp * 16, lane);
    const int64_t j0 = int64_t(t) * kQBN;
    const bool need_mask = (j0 + kQBN > p.sk) || (p.causal && j0 + kQBN - 1 > i0 + p.diag) ||
                           (p.window > 0 && j0 <= i0 + kQBM - 1 + p.diag - p.window);
#pragma unroll
    for (int n = 0; n < kQBN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float pv = exp2f(s[n][e] * p.scale_log2 - lrow[r]);
        if (need_mask) {
          const int64_t i = i0 + warp * 16 + (lane >> 2) + r * 8;
          const int64_t j = j0 + n * 8 + ((lane & 3) << 1) + (e & 1);
          if (j >= p.sk || (p.causal && j > i + p.diag) || (p.window > 0 && j <= i + p.diag - p.window)) pv = 0.f;
        }
        s[n][e] = pv * (dp[n][e] - drow[r]);  // dS
      }
    }
    // dQ += dS K (k = the 64 keys; K stored [key][hd] -> transposed fragments).
#pragma unroll
    for (int ks = 0; ks < kQBN / 16; ++ks) {
      uint32_t a[4];
      acc_to_a(s, ks, a);
      mma_a_bkn<HD>(dq, a, cK, ks * 16, lane);
    }
    __syncthreads();
  }
  cp_async_wait<0>();

  __nv_bfloat16* dqb = p.dq + qoff;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = i0 + warp * 16 + (lane >> 2) + r * 8;
    if (i >= p.sq) continue;
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) {
      const int64_t c = i * p.q_row + d * 8 + ((lane & 3) << 1);
      __nv_bfloat162 old = *reinterpret_cast<__nv_bfloat162*>(dqb + c);
      *reinterpret_cast<uint32_t*>(dqb + c) =
          pack_bf16(__low2float(old) + p.scale * dq[d][2 * r], __high2float(old) + p.scale * dq[d][2 * r + 1]);
    }
  }
}

template <int HD>
void launch_bwd(const AttentionParams& p, cudaStream_t st) {
  constexpr int smem_kv = dkdv_smem_bytes<HD>();
  EASYCTX_CUDA_CHECK(
      cudaFuncSetAttribute(attention_bwd_dkdv_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_kv));
  dim3 grid_kv(static_cast<unsigned>(CEIL_DIV(p.sk, int64_t(kKvBN))), static_cast<unsigned>(p.batch * p.hkv));
  attention_bwd_dkdv_kernel<HD><<<grid_kv, kThreads, smem_kv, st>>>(p);
  EASYCTX_CUDA_CHECK_LAUNCH("attention_bwd_dkdv_kernel");

  constexpr int smem_q = dq_smem_bytes<HD>();
  EASYCTX_CUDA_CHECK(
      cudaFuncSetAttribute(attention_bwd_dq_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_q));
  dim3 grid_q(static_cast<unsigned>(CEIL_DIV(p.sq, int64_t(kQBM))), static_cast<unsigned>(p.batch * p.hq));
  attention_bwd_dq_kernel<HD><<<grid_q, kDqThreads, smem_q, st>>>(p);
  EASYCTX_CUDA_CHECK_LAUNCH("attention_bwd_dq_kernel");
}

}  // namespace

void attention_bwd(const AttentionParams& p, cudaStream_t st) {
  if (p.sq == 0 || p.sk == 0 || p.batch == 0 || p.hq == 0) return;
  EASYCTX_CHECK(p.delta != nullptr, "attention_bwd (CUDA): no delta scratch");
  const int64_t threads = p.batch * p.sq * p.hq * 32;
  attention_bwd_delta_kernel<<<static_cast<unsigned>(CEIL_DIV(threads, int64_t(256))), 256, 0, st>>>(p);
  EASYCTX_CUDA_CHECK_LAUNCH("attention_bwd_delta_kernel");
  switch (p.hd) {
    case 64: launch_bwd<64>(p, st); break;
    case 128: launch_bwd<128>(p, st); break;
    default: EASYCTX_THROW("attention_bwd (CUDA): head dim ", p.hd, " not supported (64 or 128)");
  }
}

}  // namespace easyctx::kernels
