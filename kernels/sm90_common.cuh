// Building blocks shared by the Hopper attention kernels (attention_fwd_sm90.cu,
// attention_bwd_sm90.cu): PTX wrappers for mbarriers, TMA, named barriers, wgmma fences and
// shared-memory descriptors, and the host-side TMA tensor-map helper, so both kernels use the
// very same code (verified by the tile self-tests, sm90_wgmma_tile_check and sm90_bwd_tile_check).
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
//
// Everything is in an anonymous namespace on purpose: each .cu that includes this gets its own
// copy, g_hang included (no relocatable device code: a __device__ variable shared by two
// translation units would be two host shadows of one name), so each file reports its own hangs.
// Requires sm_90a for the device code.
#pragma once
#include <cuda.h>  // CUtensorMap and its enums only: the driver entry point comes from cudart
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "kernels/attention.h"
#include "kernels/cuda_check.h"

namespace easyctx::kernels::sm90 {
namespace {

constexpr int kRowBytes = 128;  // one swizzled row: 64 bf16

// ------------------------------------------------------------------ PTX helpers
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (TMA) and the other threads.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival plus `bytes` of expected transaction (the TMA loads complete them).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` has completed (a fresh barrier is in phase 0, so
// waiting for parity 1 returns at once: the producer's first pass over the ring).
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done)
               : "r"(bar), "r"(parity)
               : "memory");
  return done != 0;
}
// A wait that cannot complete (a protocol bug: wrong parity, arrival count or byte count)
// would hang the process. After ~2^34 cycles (~9 s) the first such wait records where it was
// (g_hang, read by sm90_take_hang_report()) and every wait, then and after, gives up: the
// kernel ends quickly with wrong results and the context stays usable, so a test run reports
// the hang and goes on to the next case instead of timing out. Only the slow path (the first
// try failed) looks at the clock and, every 16 tries, at the flag.
// [0] flag, then block x, y, z, thread, what (a barrier's shared address, a semaphore's low
// address bits), detail (parity, awaited value), kind (0 mbarrier, 1 semaphore)
__device__ unsigned int g_hang[8];
// Spins until ready() holds, giving up as above; `what`, `detail`, `kind` describe the wait.
template <typename Ready>
__device__ __forceinline__ void wait_or_give_up(Ready ready, uint32_t what, uint32_t detail, uint32_t kind) {
  if (ready()) return;
  const long long t0 = clock64();
  for (uint32_t tries = 1;; ++tries) {
    if (ready()) return;
    if ((tries & 15) == 0) {
      if (*reinterpret_cast<volatile unsigned int*>(&g_hang[0]) != 0) return;
      if (clock64() - t0 > (1ll << 34)) {
        if (atomicCAS(&g_hang[0], 0u, 1u) == 0u) {
          g_hang[1] = blockIdx.x;
          g_hang[2] = blockIdx.y;
          g_hang[3] = blockIdx.z;
          g_hang[4] = threadIdx.x;
          g_hang[5] = what;
          g_hang[6] = detail;
          g_hang[7] = kind;
          __threadfence();
        }
        return;
      }
    }
  }
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  wait_or_give_up([&] { return mbar_try_wait(bar, parity); }, bar, parity, 0);
}

// TMA: box at coordinates (c0 = column, c1 = head, c2 = row, c3 = batch) of `map` into shared
// memory at `dst`, completion (box bytes, zero-filled parts included) counted on `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// The same with an L2 eviction policy (createpolicy below): K/V tiles are read by every CTA
// of their head (and GQA group), Q tiles once.
__device__ __forceinline__ void tma_load_4d_hint(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                                 int c2, int c3, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, "
      "%4, %5}], [%6], %7;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "l"(policy)
      : "memory");
}
__device__ __forceinline__ uint64_t policy_evict_last() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint64_t policy_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

// Named barriers (ids 1..15; 0 is __syncthreads): `count` threads take part, a multiple of 32.
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed wgmma groups are pending (groups complete in order).
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins registers that an in-flight wgmma reads or writes: without it the compiler may move
// their uses across the wait (it cannot see the asynchrony) or reuse an A register early.
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle (bit layout: see the file header).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t saddr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((saddr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32) | (static_cast<uint64_t>(1) << 62);
}

// The self-test kernels: one mbarrier at `bar`, initialised by thread 0 and visible to all.
__device__ __forceinline__ void init_one_barrier(uint32_t bar) {
  if (threadIdx.x == 0) {
    mbar_init(bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
}

// The self-test kernels: a wgmma fp32 accumulator fragment (N values per thread; layout: the
// file header) into row-major out of leading dimension ld. row0: the thread's first row, colq
// its first column of each 8-column chunk.
template <int N>
__device__ __forceinline__ void store_acc(float* out, const float (&d)[N], int row0, int colq, int ld) {
#pragma unroll
  for (int i = 0; i < N; ++i) out[(row0 + 8 * ((i / 2) % 2)) * ld + 8 * (i / 4) + colq + (i % 2)] = d[i];
}

__device__ __forceinline__ float ex2(float x) {  // 2^x; ex2(-inf) = +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low 16 bits) = lo
  return *reinterpret_cast<uint32_t*>(&v);
}

// Dynamic shared memory is only guaranteed 16-byte aligned: round up to 1024 (1 KiB extra).
template <typename T>
__device__ __forceinline__ T& aligned_smem(unsigned char* raw) {
  const uint32_t a = smem_u32(raw);
  return *reinterpret_cast<T*>(raw + ((1024 - (a & 1023)) & 1023));
}

// ------------------------------------------------------------------ host side
// "" normally; after a wait of this translation unit's kernels gave up (g_hang: an mbarrier, or
// with h[7] set a semaphore), where it happened. Resets the record.
std::string take_hang_report() {
  unsigned int h[8] = {};
  EASYCTX_CUDA_CHECK(cudaMemcpyFromSymbol(h, g_hang, sizeof(h)));
  if (h[0] == 0) return "";
  const unsigned int zero[8] = {};
  EASYCTX_CUDA_CHECK(cudaMemcpyToSymbol(g_hang, zero, sizeof(zero)));
  char b[256];
  std::snprintf(b, sizeof(b),
                "%s wait gave up after ~2^34 cycles: block (%u,%u,%u) thread %u (warpgroup %u) %s 0x%x %s %u",
                h[7] ? "a dQ semaphore" : "an mbarrier", h[1], h[2], h[3], h[4], h[4] / 128,
                h[7] ? "semaphore at" : "barrier at shared", h[5], h[7] ? "waiting for key block" : "parity", h[6]);
  return b;
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  // Through cudart's entry-point query, so no -lcuda link is needed.
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    EASYCTX_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || f == nullptr)
      EASYCTX_THROW("attention_fwd_sm90: the driver has no cuTensorMapEncodeTiled (query result ", static_cast<int>(q),
                    ")");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// 4-D map over [batch][rows][heads][hd] bf16, dimensions innermost first (dim, head, row,
// batch) so the byte strides grow (hd*2 <= row stride <= batch stride), as the driver's
// stride rule describes; boxes of 64 columns (128 bytes, the swizzle span) x 1 head x box_rows
// rows x 1 batch land in shared memory as box_rows rows of 128 bytes, 128-byte swizzled;
// out-of-bounds elements (rows past Sq/Sk) read as zeros.
CUtensorMap make_map(const void* ptr, int64_t hd, int64_t rows, int64_t heads, int64_t batch, int64_t row_stride,
                     int64_t batch_stride, int box_rows, const char* what) {
  CUtensorMap m;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(hd), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(batch)};
  // A single batch's stride is never used; TMA still wants a multiple of 16 bytes.
  if (batch == 1) batch_stride = rows * row_stride;
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(hd) * 2, static_cast<cuuint64_t>(row_stride) * 2,
                                 static_cast<cuuint64_t>(batch_stride) * 2};
  const cuuint32_t box[4] = {64, 1, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t estride[4] = {1, 1, 1, 1};
  const CUresult r = encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(ptr), dims, strides, box,
                                 estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    EASYCTX_THROW("sm90 attention: cuTensorMapEncodeTiled failed for ", what, " (CUresult ", static_cast<int>(r),
                  ", hd ", hd, ", rows ", rows, ", heads ", heads, ", batch ", batch, ", row stride ", row_stride, ")");
  return m;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// SMs of the calling thread's current device: both kernels run one CTA per SM, so their grids
// are sized (forward, persistent) or ordered (backward, atomic) by it.
int current_device_sms() {
  int dev = 0, sms = 0;
  EASYCTX_CUDA_CHECK(cudaGetDevice(&dev));
  EASYCTX_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

// The layout rules both kernels' TMA loads share (head dim, sizes, head counts, row and batch
// strides: q's for the query-side tensors, k's for the key side): nullptr where the layout can
// be loaded, else why not. Pointers, their alignment and the grid bounds that differ between
// the kernels are the callers' (attention_fwd_sm90_supported, attention_bwd_sm90_supported).
const char* layout_refusal(const AttentionParams& p) {
  if (p.hd != 64 && p.hd != 128) return "head dim is not 64 or 128";
  if (p.batch < 1 || p.batch > 65535) return "batch not in [1, 65535]";
  if (p.hq < 1 || p.hkv < 1 || p.hq % p.hkv != 0) return "hq not a multiple of hkv";
  if (p.sq < 1 || p.sk < 1 || p.sq > (int64_t{1} << 30) || p.sk > (int64_t{1} << 30))
    return "sq or sk not in [1, 2^30]";
  if (p.q_row % 8 != 0 || p.k_row % 8 != 0 || p.q_row < p.hq * p.hd || p.k_row < p.hkv * p.hd)
    return "row strides not multiples of 8 elements or shorter than a row";
  if (p.batch > 1 && (p.q_batch % 8 != 0 || p.k_batch % 8 != 0 || p.q_batch <= 0 || p.k_batch <= 0))
    return "batch strides not positive multiples of 8 elements";
  constexpr int64_t kMaxStride = (int64_t{1} << 39);  // TMA: global strides < 2^40 bytes
  if (p.q_row >= kMaxStride || p.k_row >= kMaxStride || p.q_batch >= kMaxStride || p.k_batch >= kMaxStride)
    return "strides too large for TMA";
  return nullptr;
}

}  // namespace
}  // namespace easyctx::kernels::sm90
