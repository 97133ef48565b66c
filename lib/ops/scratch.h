// Scratch memory of the backends, written down once: the functions the CUDA backend sizes
// its allocations with (and the CPU backend its LM-head tile), for the memory plan
// (lib/plan) to predict the same bytes from the same code. Plain C++ (no CUDA), compiled in
// every build; the kernels read their block constants from here too. The attention paths'
// scratch is in ops/attention_route.h, beside the router that picks the path.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace easyctx::ops {

// One scratch buffer: what it holds, its bytes, and how they are counted (for a report).
struct ScratchBuffer {
  std::string name;
  int64_t bytes = 0;
  std::string formula;
};

// ---- The CUDA backend's own allocations (for its lifetime)
// The cuBLASLt workspace: CudaBackendOptions::cublas_workspace's default (the plan reads it here).
constexpr int64_t kCublasWorkspaceBytes = int64_t{32} << 20;
struct CudaOwnBytes {
  int64_t cublas_workspace = 0;  // cuBLASLt's workspace
  int64_t error_flag = 0;        // a device int kernels set on bad token ids / labels
  int64_t total() const { return cublas_workspace + error_flag; }
  std::vector<ScratchBuffer> list() const;
};
CudaOwnBytes cuda_own_bytes(int64_t cublas_workspace = kCublasWorkspaceBytes);

// ---- LM head + cross entropy (lm_head_loss), tiled along the tokens
// The most logits one tile holds, whatever tile_tokens asks: CUDA 2^26 f32 (256 MiB), the
// CPU (host memory, its own element type) 2^24.
constexpr int64_t kCudaMaxTileLogits = int64_t{1} << 26;
constexpr int64_t kCpuMaxTileLogits = int64_t{1} << 24;
// CUDA: a tile may always hold this many rows, past 2^26 logits for vocabularies above 64K.
// Each tile reads the [V, D] head twice (logits, dx) and reads and writes the f32 [V, D] head
// gradient once (dw += G^T x): Qwen's 152K vocabulary at 2^26 logits made 441-row tiles, 74 of
// them at 32K tokens, 320 GB of head-gradient traffic a step (~100 ms of HBM) and a dx GEMM of
// 441 rows too short to fill the SMs; at 1024 rows 32 tiles (~0.9 GiB of tile scratch).
constexpr int64_t kCudaMinTileRows = 1024;
// The most logits a CUDA tile holds for a vocabulary of `vocab`.
int64_t cuda_max_tile_logits(int64_t vocab);
// Rows of x per logits tile: tile_tokens (<= 0: all n) and at most n, capped so that the
// tile holds at most max_logits logits; at least 1.
int64_t lm_head_tile_rows(int64_t tile_tokens, int64_t n, int64_t vocab, int64_t max_logits);
struct LmHeadScratch {
  bool cuda = true;  // CUDA backend (device scratch) or the CPU's (heap)
  int64_t tile_rows = 0;
  int64_t logits = 0;  // [tile, V] logits (CUDA: f32; the CPU: its element type, on the heap)
  int64_t grad = 0;    // CUDA: bf16 [tile, V] gradient tile (backward, bf16 data; f32 data: in place)
  int64_t nll = 0;     // f64 per-token NLL (CUDA: [n + 2], then the sum and the label count; CPU: [n];
                       // lm_head_score on CUDA: [n])
  int64_t top = 0;     // lm_head_score on CUDA: i32 [n] argmax flags
  std::vector<ScratchBuffer> list() const;
};
// CudaBackend::lm_head_loss: n tokens, vocab V; backward: dx asked; bf16_data: x is bf16.
LmHeadScratch cuda_lm_head_scratch(int64_t n, int64_t vocab, int64_t tile_tokens, bool backward, bool bf16_data);
// CudaBackend::lm_head_score: the f32 logits tile and the per-row NLL and argmax flags.
LmHeadScratch cuda_lm_head_score_scratch(int64_t n, int64_t vocab, int64_t tile_tokens);
// cpu::lm_head_loss (heap vectors, outside the backend's counters); element_bytes: 4 or 8.
LmHeadScratch cpu_lm_head_scratch(int64_t n, int64_t vocab, int64_t tile_tokens, int64_t element_bytes);

// ---- RMSNorm backward: dw through per-chunk partials (one block of rows each), then an
// ordered column sum.
constexpr int64_t kRmsnormDwRows = 64;
inline int64_t rmsnorm_dw_chunks(int64_t n) { return (n + kRmsnormDwRows - 1) / kRmsnormDwRows; }
struct RmsnormBwdScratch {
  int64_t chunks = 0;
  int64_t dw_partials = 0;  // f32 [chunks, D] (0 without dw)
  std::vector<ScratchBuffer> list() const;
};
RmsnormBwdScratch rmsnorm_bwd_scratch(int64_t n, int64_t d, bool with_dw = true);

// ---- Embedding backward: ids sorted (cub radix sort, stable) so one block owns each row.
struct EmbeddingBwdScratch {
  int64_t ids = 0;                 // i32 [3, n]: sorted ids, iota (the sort's input values), order
  int64_t sort_temp_estimate = 0;  // cub's temp storage (the backend asks cub; this estimates it)
  std::vector<ScratchBuffer> list() const;
};
EmbeddingBwdScratch embedding_bwd_scratch(int64_t n);

// ---- sum_squares: fp64 partials of a fixed number of blocks, then one block sums them.
constexpr int64_t kSumSquaresBlocks = 1024;
struct SumSquaresScratch {
  int64_t blocks = 0;  // the partials f64[blocks]; the sum follows them
  int64_t bytes = 0;   // f64 [blocks + 1]
  std::vector<ScratchBuffer> list() const;
};
SumSquaresScratch sum_squares_scratch();

}  // namespace easyctx::ops
