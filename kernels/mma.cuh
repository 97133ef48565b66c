// Warp-level tensor-core helpers for sm_80+ (also used on sm_90): cp.async tile loads into
// XOR-swizzled shared memory, ldmatrix, and mma.sync m16n8k16 bf16 -> fp32.
//
// Shared-memory tiles are [rows][HD] bf16 with the 16-byte chunks of each row permuted:
// chunk c of row r lives at chunk c ^ (r & 7). An ldmatrix of 8 consecutive rows at one
// logical chunk then touches 8 different bank groups (no conflicts).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace easyctx::kernels::mma {

template <int HD>
__device__ __forceinline__ int swz(int row, int col) {  // element offset of (row, col) in a tile
  return row * HD + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; src_bytes = 0 zero-fills the destination (rows past the end).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Tile rows [row0, row0 + ROWS) of a strided global matrix into swizzled smem; rows >= limit
// are zero-filled. All NT threads of the block take part.
template <int ROWS, int HD, int NT>
__device__ __forceinline__ void load_tile(__nv_bfloat16* smem, const __nv_bfloat16* g, int64_t row_stride, int64_t row0,
                                          int64_t limit) {
  constexpr int CH = HD / 8;
  for (int c = threadIdx.x; c < ROWS * CH; c += NT) {
    const int r = c / CH, ch = c % CH;
    const int64_t gr = row0 + r;
    const bool ok = gr < limit;
    const __nv_bfloat16* src = ok ? g + gr * row_stride + ch * 8 : g;
    cp_async16(smem + swz<HD>(r, ch * 8), src, ok ? 16 : 0);
  }
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d += a * b for one m16n8k16 tile (a row-major 16x16, b column-major 16x8).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Fragment addresses (lane = threadIdx.x & 31) inside a swizzled [rows][HD] tile:
// A operand (16 rows x 16 k, row-major storage), starting at (row0, k0).
template <int HD>
__device__ __forceinline__ const __nv_bfloat16* frag_a(const __nv_bfloat16* t, int row0, int k0, int lane) {
  return t + swz<HD>(row0 + (lane & 15), k0 + ((lane >> 4) << 3));
}
// B operand for two n8 tiles from storage [n][k] (k contiguous): n0..n0+15, k0..k0+15.
template <int HD>
__device__ __forceinline__ const __nv_bfloat16* frag_b_nk(const __nv_bfloat16* t, int n0, int k0, int lane) {
  return t + swz<HD>(n0 + (lane & 7) + ((lane >> 4) << 3), k0 + (((lane >> 3) & 1) << 3));
}
// B operand for two n8 tiles from storage [k][n] (n contiguous, ldmatrix.trans).
template <int HD>
__device__ __forceinline__ const __nv_bfloat16* frag_b_kn(const __nv_bfloat16* t, int k0, int n0, int lane) {
  return t + swz<HD>(k0 + (lane & 7) + (((lane >> 3) & 1) << 3), n0 + ((lane >> 4) << 3));
}

// The fp32 accumulators of n8 tiles 2ks and 2ks + 1 as one bf16 A fragment (k = their 16
// columns): FlashAttention-2's S -> P with no data movement.
template <int N>
__device__ __forceinline__ void acc_to_a(const float (&c)[N][4], int ks, uint32_t (&a)[4]) {
  a[0] = pack_bf16(c[2 * ks][0], c[2 * ks][1]);
  a[1] = pack_bf16(c[2 * ks][2], c[2 * ks][3]);
  a[2] = pack_bf16(c[2 * ks + 1][0], c[2 * ks + 1][1]);
  a[3] = pack_bf16(c[2 * ks + 1][2], c[2 * ks + 1][3]);
}

// acc += a B[k0..k0+15][0..HD) for one warp's 16 rows, B stored [k][HD] (ldmatrix.trans).
template <int HD>
__device__ __forceinline__ void mma_a_bkn(float (&acc)[HD / 8][4], const uint32_t (&a)[4], const __nv_bfloat16* b,
                                          int k0, int lane) {
#pragma unroll
  for (int np = 0; np < HD / 16; ++np) {
    uint32_t bfr[4];
    ldmatrix_x4_trans(bfr, frag_b_kn<HD>(b, k0, np * 16, lane));
    mma_bf16(acc[2 * np], a, bfr[0], bfr[1]);
    mma_bf16(acc[2 * np + 1], a, bfr[2], bfr[3]);
  }
}

// c1 = A1 B1^T and c2 = A2 B2^T for one warp's 16 rows (row0.. of A1, A2, stored [rows][HD])
// and N columns (B1, B2 stored [N][HD]), the two GEMMs interleaved.
template <int HD, int N>
__device__ __forceinline__ void mma_pair_nt(float (&c1)[N / 8][4], float (&c2)[N / 8][4], const __nv_bfloat16* a1,
                                            const __nv_bfloat16* a2, const __nv_bfloat16* b1, const __nv_bfloat16* b2,
                                            int row0, int lane) {
#pragma unroll
  for (int n = 0; n < N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) c1[n][e] = c2[n][e] = 0.f;
#pragma unroll
  for (int ks = 0; ks < HD / 16; ++ks) {
    uint32_t x1[4], x2[4];
    ldmatrix_x4(x1, frag_a<HD>(a1, row0, ks * 16, lane));
    ldmatrix_x4(x2, frag_a<HD>(a2, row0, ks * 16, lane));
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t y1[4], y2[4];
      ldmatrix_x4(y1, frag_b_nk<HD>(b1, np * 16, ks * 16, lane));
      ldmatrix_x4(y2, frag_b_nk<HD>(b2, np * 16, ks * 16, lane));
      mma_bf16(c1[2 * np], x1, y1[0], y1[1]);
      mma_bf16(c1[2 * np + 1], x1, y1[2], y1[3]);
      mma_bf16(c2[2 * np], x2, y2[0], y2[1]);
      mma_bf16(c2[2 * np + 1], x2, y2[2], y2[3]);
    }
  }
}

// One step over the key tiles of a double-buffered K/V stream: starts loading tile t + 1 (BN
// rows) into buffer (t + 1) & 1 of sK, sV, then waits until tile t (buffer t & 1) has arrived
// and every thread is past the barrier.
template <int BN, int HD, int kThreads>
__device__ __forceinline__ void kv_stream_step(__nv_bfloat16* sK, __nv_bfloat16* sV, const __nv_bfloat16* kb,
                                               const __nv_bfloat16* vb, int64_t k_row, int64_t sk, int t, int ntiles) {
  if (t + 1 < ntiles) {
    const int nb = (t + 1) & 1;
    load_tile<BN, HD, kThreads>(sK + nb * BN * HD, kb, k_row, int64_t(t + 1) * BN, sk);
    load_tile<BN, HD, kThreads>(sV + nb * BN * HD, vb, k_row, int64_t(t + 1) * BN, sk);
  }
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
}

}  // namespace easyctx::kernels::mma
