#include "ops/scratch.h"

#include <algorithm>

namespace easyctx::ops {

CudaOwnBytes cuda_own_bytes(int64_t cublas_workspace) { return {cublas_workspace, static_cast<int64_t>(sizeof(int))}; }

std::vector<ScratchBuffer> CudaOwnBytes::list() const {
  return {{"cuBLASLt workspace", cublas_workspace, "CudaBackendOptions::cublas_workspace (default 32 MiB)"},
          {"error flag", error_flag, "4 B"}};
}

int64_t lm_head_tile_rows(int64_t tile_tokens, int64_t n, int64_t vocab, int64_t max_logits) {
  const int64_t want = tile_tokens > 0 ? std::min(tile_tokens, n) : n;
  return std::max<int64_t>(1, std::min(want, max_logits / std::max<int64_t>(1, vocab)));
}

int64_t cuda_max_tile_logits(int64_t vocab) { return std::max(kCudaMaxTileLogits, kCudaMinTileRows * vocab); }

LmHeadScratch cuda_lm_head_scratch(int64_t n, int64_t vocab, int64_t tile_tokens, bool backward, bool bf16_data) {
  LmHeadScratch s;
  s.tile_rows = lm_head_tile_rows(tile_tokens, n, vocab, cuda_max_tile_logits(vocab));
  s.logits = s.tile_rows * vocab * 4;
  s.grad = backward && bf16_data ? s.tile_rows * vocab * 2 : 0;
  s.nll = (n + 2) * 8;
  return s;
}

LmHeadScratch cuda_lm_head_score_scratch(int64_t n, int64_t vocab, int64_t tile_tokens) {
  LmHeadScratch s;
  s.tile_rows = lm_head_tile_rows(tile_tokens, n, vocab, cuda_max_tile_logits(vocab));
  s.logits = s.tile_rows * vocab * 4;
  s.nll = n * 8;
  s.top = n * 4;
  return s;
}

LmHeadScratch cpu_lm_head_scratch(int64_t n, int64_t vocab, int64_t tile_tokens, int64_t element_bytes) {
  LmHeadScratch s;
  s.cuda = false;
  s.tile_rows = lm_head_tile_rows(tile_tokens, n, vocab, kCpuMaxTileLogits);
  s.logits = s.tile_rows * vocab * element_bytes;
  s.nll = n * 8;
  return s;
}

std::vector<ScratchBuffer> LmHeadScratch::list() const {
  if (!cuda)
    return {{"logits tile (heap)", logits, "elt x tile x V, tile = min(lm_head_tile, n, 2^24 / V)"},
            {"per-token NLL f64 (heap)", nll, "8 x n"}};
  std::vector<ScratchBuffer> v{
      {"logits tile f32", logits, "4 x tile x V, tile = min(lm_head_tile, n, max(2^26 / V, 1024))"}};
  if (grad) v.push_back({"logits gradient tile bf16", grad, "2 x tile x V"});
  if (top) {  // lm_head_score
    v.push_back({"per-row NLL f64", nll, "8 x n"});
    v.push_back({"per-row argmax flags i32", top, "4 x n"});
    return v;
  }
  v.push_back({"per-token NLL f64", nll, "8 x (n + 2)"});
  return v;
}

RmsnormBwdScratch rmsnorm_bwd_scratch(int64_t n, int64_t d, bool with_dw) {
  RmsnormBwdScratch s;
  s.chunks = rmsnorm_dw_chunks(n);
  s.dw_partials = with_dw ? s.chunks * d * 4 : 0;
  return s;
}

std::vector<ScratchBuffer> RmsnormBwdScratch::list() const {
  return {{"dw partials f32", dw_partials, "4 x ceil(n / 64) x D"}};
}

EmbeddingBwdScratch embedding_bwd_scratch(int64_t n) { return {3 * n * 4, 8 * n + (int64_t{1} << 20)}; }

std::vector<ScratchBuffer> EmbeddingBwdScratch::list() const {
  return {{"sorted ids, order, iota", ids, "3 x 4 x n"},
          {"cub radix-sort temp (estimate)", sort_temp_estimate, "~ 8 n + 1 MiB"}};
}

SumSquaresScratch sum_squares_scratch() { return {kSumSquaresBlocks, (kSumSquaresBlocks + 1) * 8}; }

std::vector<ScratchBuffer> SumSquaresScratch::list() const { return {{"sum-of-squares partials", bytes, "8 x 1025"}}; }

}  // namespace easyctx::ops
