// The CUDA backend's attention router, in plain C++ (compiled in every build, also without
// CUDA): which route an attention_fwd / attention_bwd call takes, decided from the call's
// shape and the backend's options alone, and the scratch each route allocates. The CUDA
// backend (lib/ops/cuda/cuda_attention.*) asks it for the routes of every call and sizes its
// scratch with these functions; the memory plan, the startup log and the per-op profile ask
// the same functions, so a route or a scratch size is written once.
//
// The router assumes cuDNN accepts every shape it is asked for. At run time the backend
// tries the routes of attention_*_routes() in order and takes the first that runs: a route
// through cuDNN falls back to the next where cuDNN declines the shape (no plan, or cuDNN
// cannot start) or a buffer is not 16-byte aligned. The last route is always the kernel
// (or, for a call without keys or rows, the route that writes the empty result).
//
// Routes (docs/cuda.md, "Attention"):
//  forward
//   - cudnn causal graph: a whole causal square (q and k at the same positions) in one call of
//     cuDNN's composite causal forward graph (CudaBackendOptions::cudnn_causal_graph);
//   - cudnn causal in query chunks: a causal square of batch 1 and S >= 2t in query chunks of
//     t = causal_chunk_rows(S) rows: the keys before a chunk through cuDNN's SDPA without a
//     mask, its t x t diagonal through the causal kernel, merged by LSE in fp32;
//   - cudnn unmasked: a block every query of which sees every key (not causal, or causal with
//     the diagonal past the last key: a ring's off-diagonal step) through cuDNN's SDPA node;
//   - kernel: the FlashAttention-2 style kernels (kernels/attention_fwd.cu).
//   - sm90 kernel (AttentionRouteOptions::sm90: an sm_90 device, H100/H200): the Hopper kernel
//     (kernels/attention_fwd_sm90.cu: TMA, wgmma, warp-specialised), before cuDNN where it beat
//     cuDNN 9.19's forward in the same process (sm90_before_cudnn), else after the cuDNN
//     routes, in place of the slower FA2 kernel. It takes any visibility (causal squares, ring
//     blocks with a diagonal offset, unmasked blocks) at head dims 64 and 128.
//  backward (unmasked blocks and causal squares through cuDNN's composite backward; T =
//  attention_bwd_tile)
//   - cudnn one call in place: gradients overwritten (AttentionBlock::accumulate false) and
//     bf16: cuDNN writes dq/dk/dv itself, any length with atomic dQ, up to T x T deterministic;
//   - cudnn one call: a block of at most T x T into bf16 scratch, then added;
//   - cudnn tiles: a larger block in T x T tiles per sequence (a causal square: the tiles on
//     and below the diagonal), summed in fp32;
//   - kernel: kernels/attention_bwd.cu (f32 gradients: into bf16 scratch, then added).
//  A call whose sliding window cuts some (query, key) pair of the block (AttentionCall::window)
//  runs on our kernels only, both ways: the sm90 kernel on an sm_90 device, else the FA2 kernel
//  (each skips the key tiles before a query tile's window and masks its left edge; cuDNN's
//  graphs here have no band mask). A window that cuts nothing is dropped from the call.
//   - sm90 kernel (AttentionRouteOptions::sm90): the Hopper backward (kernels/attention_bwd_sm90.cu,
//     FlashAttention-3's structure; split dQ), deterministic or atomic as the
//     backend; before cuDNN where it beat cuDNN 9.19's backward of the same mode in the same
//     process (sm90_bwd_before_cudnn), else in place of the FA2 kernel. Any visibility, head
//     dims 64 and 128; f32 gradients: into bf16 scratch, then added.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "ops/scratch.h"

namespace easyctx::ops {

// The shape of one attention_fwd / attention_bwd call, as the router sees it.
struct AttentionCall {
  int64_t batch = 1, sq = 0, sk = 0, hq = 0, hkv = 0, hd = 0;
  bool causal = true;
  int64_t diag = 0;        // q_offset - k_offset: key j is visible to query i iff j <= i + diag
  bool f32_grads = false;  // attention_bwd: dq/dk/dv are f32 (a ring's accumulators), else bf16
  bool accumulate = true;  // attention_bwd: AttentionBlock::accumulate (false: overwrite)
  // The sliding window where it cuts some pair of the block (key j visible to query i only if
  // j > i + diag - window), else 0 (attention_call drops a window that cuts nothing).
  int64_t window = 0;
  bool windowed() const { return window > 0; }
  // Every query sees every key (not causal, or the diagonal past the last key; no window).
  bool unmasked() const { return (!causal || diag >= sk - 1) && !windowed(); }
  // A whole causal square: queries and keys at the same positions (top-left mask), no window.
  bool causal_square() const { return causal && diag == 0 && sq == sk && !windowed(); }
};
// The window of AttentionBlock `window` as a block of sq queries and sk keys at diagonal offset
// diag sees it: `window` when it hides some key from some query (the last query's window starts
// after key 0), else 0.
int64_t effective_window(int64_t window, int64_t sq, int64_t sk, int64_t diag);
// The call of attention_fwd / attention_bwd on q [B, Sq, Hq, hd], k [B, Sk, Hkv, hd].
AttentionCall attention_call(const Tensor& q, const Tensor& k, const AttentionBlock& blk, bool f32_grads = false);

// The backend's options that choose routes (ops::CudaBackendOptions' fields of the same meaning).
struct AttentionRouteOptions {
  bool cudnn = true;          // cudnn_attention
  bool causal_graph = true;   // cudnn_causal_graph
  bool deterministic = true;  // deterministic
  bool sm90 = false;          // sm90_attention on an sm_90 device (the plan: a Hopper target GPU)
  int64_t bwd_tile = 0;       // attention_bwd_tile (0: attention_bwd_tile(deterministic))
  // T: rows and columns of the backward's tiles.
  int64_t tile() const { return attention_bwd_tile(deterministic, bwd_tile); }
};

// Whether the Hopper forward kernel goes before cuDNN's routes for a call: where it measured
// faster than cuDNN's forward (figures: docs/performance.md, "Hopper attention").
bool sm90_before_cudnn(const AttentionCall& c);

enum class AttentionFwdRoute { NoKeys, Sm90Kernel, CudnnCausalGraph, CudnnCausalChunks, CudnnUnmasked, Kernel };
// The same for the Hopper backward kernel (same figures).
bool sm90_bwd_before_cudnn(const AttentionCall& c, const AttentionRouteOptions& o);

enum class AttentionBwdRoute { NoRows, CudnnInPlace, Sm90Kernel, CudnnOneCall, CudnnTiles, Kernel };
// "no keys", "sm90 kernel", "cudnn causal graph", "cudnn causal in query chunks", "cudnn unmasked",
// "kernel".
const char* route_name(AttentionFwdRoute r);
// "no rows", "cudnn one call in place", "sm90 kernel", "cudnn one call", "cudnn tiles", "kernel".
const char* route_name(AttentionBwdRoute r);

// The routes the CUDA backend tries for a call, in order (see the top of this file); the
// first is the route taken when cuDNN accepts the shapes.
std::vector<AttentionFwdRoute> attention_fwd_routes(const AttentionCall& c, const AttentionRouteOptions& o);
std::vector<AttentionBwdRoute> attention_bwd_routes(const AttentionCall& c, const AttentionRouteOptions& o);
AttentionFwdRoute attention_fwd_route(const AttentionCall& c, const AttentionRouteOptions& o);
AttentionBwdRoute attention_bwd_route(const AttentionCall& c, const AttentionRouteOptions& o);

// One line for logs: both directions' routes of a call with their parameters, e.g.
// "forward: cudnn causal graph; backward: cudnn tiles (4096 x 4096, 16 x 16 tiles, deterministic)".
std::string describe_attention_route(const AttentionCall& c, const AttentionRouteOptions& o);

// ---- Scratch of the routes (bytes). Buffers are allocated in the order listed and live
// together until the call returns; cuDNN's workspace is cuDNN's own (grown to its largest
// plan's need and kept), here an estimate.

// cudnn causal in query chunks: t rows per chunk and one chunk's accumulators.
struct CausalChunkScratch {
  int64_t rows = 0;     // t = causal_chunk_rows(S)
  int64_t acc_o = 0;    // f32 [t, Hq, hd]: the chunk's output, merged
  int64_t acc_lse = 0;  // f32 [Hq, t]: its LSE
  int64_t blk_o = 0;    // bf16 [t, Hq, hd]: one part's output
  int64_t blk_lse = 0;  // f32 [Hq, t]: its LSE
  std::vector<ScratchBuffer> list() const;
};
CausalChunkScratch causal_chunk_scratch(const AttentionCall& c);
// The forward route's buffers (only query chunks have any).
std::vector<ScratchBuffer> attention_fwd_scratch(AttentionFwdRoute r, const AttentionCall& c);

struct AttentionBwdScratch {
  AttentionBwdRoute route = AttentionBwdRoute::Kernel;
  int64_t tile = 0;  // cudnn tiles: T
  // bf16 gradients written before they are added into dq/dk/dv: one call: the block's
  // [B (Sq Hq + 2 Sk Hkv) hd]; tiles: one tile's [T (Hq + 2 Hkv) hd]; kernel, sm90 kernel: the
  // block's, only with f32 gradients (else the kernel adds into them itself).
  int64_t grads = 0;
  int64_t dq_acc = 0;   // cudnn tiles: f32 [Sq, Hq, hd], dQ of one sequence (0: f32 gradients)
  int64_t dkv_acc = 0;  // cudnn tiles: f32 [2, T, Hkv, hd], dK and dV of one key tile
  int64_t delta = 0;    // kernel: f32 [B, Hq, Sq], rowsum(dO o)
  // sm90 kernel: its fp32 dQ accumulator [B, Hq, Sq_pad, hd], lse2, delta and semaphores
  // (kernels/attention_sm90_scratch.h)
  int64_t sm90 = 0;
  ScratchBuffer cudnn_workspace;  // cuDNN's workspace for the route's calls (estimate; 0: no cuDNN)
  // The buffers in allocation order (those of 0 bytes left out), then the workspace.
  std::vector<ScratchBuffer> list() const;
};
AttentionBwdScratch attention_bwd_scratch(AttentionBwdRoute r, const AttentionCall& c, const AttentionRouteOptions& o);

// cuDNN's workspace for one composite backward call of b x rows queries and b x cols keys
// (softmax sum, then dP deterministic or the dQ accumulator atomic), a calibrated estimate.
int64_t cudnn_bwd_workspace(int64_t b, int64_t rows, int64_t cols, int64_t hq, int64_t hkv, int64_t hd,
                            bool deterministic);

}  // namespace easyctx::ops
