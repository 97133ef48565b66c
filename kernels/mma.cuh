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
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Tile rows [row0, row0 + ROWS) of a strided global matrix into swizzled smem; rows >= limit
// are zero-filled. All NT threads of the block take part.
template <int ROWS, int HD, int NT>
__device__ __forceinline__ void load_tile(__nv_bfloat16* smem, const __nv_bfloat16* g, int64_t row_stride,
                                          int64_t row0, int64_t limit) {
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

}  // namespace easyctx::kernels::mma
