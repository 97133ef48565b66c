#include "ops/attention_route.h"

#include "kernels/attention_sm90_scratch.h"

namespace easyctx::ops {

AttentionCall attention_call(const Tensor& q, const Tensor& k, const AttentionBlock& blk, bool f32_grads) {
  AttentionCall c;
  c.batch = q.dim(0);
  c.sq = q.dim(1);
  c.hq = q.dim(2);
  c.hd = q.dim(3);
  c.sk = k.dim(1);
  c.hkv = k.dim(2);
  c.causal = blk.causal;
  c.diag = blk.q_offset - blk.k_offset;
  c.f32_grads = f32_grads;
  c.accumulate = blk.accumulate;
  c.window = effective_window(blk.window, c.sq, c.sk, c.diag);
  return c;
}

int64_t effective_window(int64_t window, int64_t sq, int64_t sk, int64_t diag) {
  // Query sq - 1 hides key 0 iff 0 <= sq - 1 + diag - window; every other pair is further in.
  return window > 0 && sq > 0 && sk > 0 && sq - 1 + diag - window >= 0 ? window : 0;
}

const char* route_name(AttentionFwdRoute r) {
  switch (r) {
    case AttentionFwdRoute::NoKeys: return "no keys";
    case AttentionFwdRoute::Sm90Kernel: return "sm90 kernel";
    case AttentionFwdRoute::CudnnCausalGraph: return "cudnn causal graph";
    case AttentionFwdRoute::CudnnCausalChunks: return "cudnn causal in query chunks";
    case AttentionFwdRoute::CudnnUnmasked: return "cudnn unmasked";
    case AttentionFwdRoute::Kernel: return "kernel";
  }
  return "?";
}

const char* route_name(AttentionBwdRoute r) {
  switch (r) {
    case AttentionBwdRoute::NoRows: return "no rows";
    case AttentionBwdRoute::CudnnInPlace: return "cudnn one call in place";
    case AttentionBwdRoute::Sm90Kernel: return "sm90 kernel";
    case AttentionBwdRoute::CudnnOneCall: return "cudnn one call";
    case AttentionBwdRoute::CudnnTiles: return "cudnn tiles";
    case AttentionBwdRoute::Kernel: return "kernel";
  }
  return "?";
}

bool sm90_before_cudnn(const AttentionCall& c) {
  if (c.hd == 64) return true;  // faster than cuDNN at every measured shape (1.03-1.09x)
  // hd 128: faster with a mask (0.99-1.10x); cuDNN's unmasked SDPA stays first (we: 0.98-0.99x)
  return c.hd == 128 && !c.unmasked();
}

bool sm90_bwd_before_cudnn(const AttentionCall& c, const AttentionRouteOptions& o) {
  if (!o.deterministic) return false;  // cuDNN's atomic backward is faster (we: 0.87-0.96x)
  if (c.hd == 128) return true;        // deterministic hd 128: 1.04-1.30x at every measured shape
  // hd 64: unmasked 1.47x; causal from 16K rows (1.31-1.37x; 0.93x at 8K, too few CTAs)
  return c.hd == 64 && (c.unmasked() || c.sq >= 16384);
}

std::vector<AttentionFwdRoute> attention_fwd_routes(const AttentionCall& c, const AttentionRouteOptions& o) {
  if (c.sk == 0) return {AttentionFwdRoute::NoKeys};  // every row is empty: o = 0, lse = -inf
  std::vector<AttentionFwdRoute> r;
  if (c.windowed()) {  // our kernels have the band mask (and skip the tiles outside it); cuDNN's graphs here do not
    if (o.sm90) r.push_back(AttentionFwdRoute::Sm90Kernel);
    r.push_back(AttentionFwdRoute::Kernel);
    return r;
  }
  // The Hopper kernel before cuDNN where it measured faster; elsewhere in place of the FA2 kernel.
  const bool sm90_first = o.sm90 && sm90_before_cudnn(c);
  if (sm90_first) r.push_back(AttentionFwdRoute::Sm90Kernel);
  if (o.cudnn) {
    if (c.causal_square() && o.causal_graph) r.push_back(AttentionFwdRoute::CudnnCausalGraph);
    if (c.causal_square() && c.batch == 1 && c.sq >= 2 * causal_chunk_rows(c.sq))
      r.push_back(AttentionFwdRoute::CudnnCausalChunks);
    if (c.unmasked()) r.push_back(AttentionFwdRoute::CudnnUnmasked);
  }
  if (o.sm90 && !sm90_first) r.push_back(AttentionFwdRoute::Sm90Kernel);
  r.push_back(AttentionFwdRoute::Kernel);
  return r;
}

std::vector<AttentionBwdRoute> attention_bwd_routes(const AttentionCall& c, const AttentionRouteOptions& o) {
  const int64_t T = o.tile();
  const bool fits = c.sq <= T && c.sk <= T;
  // cuDNN's composite backward takes blocks without a mask and causal squares.
  const bool cudnn = o.cudnn && (c.unmasked() || c.causal_square());
  const bool rows = c.sk > 0 && c.sq > 0;
  // The Hopper kernel before cuDNN where it measured faster; elsewhere in place of the FA2 kernel.
  const bool sm90_first = o.sm90 && rows && sm90_bwd_before_cudnn(c, o);
  std::vector<AttentionBwdRoute> r;
  if (c.windowed() && rows) {  // as the forward: our kernels only
    if (o.sm90) r.push_back(AttentionBwdRoute::Sm90Kernel);
    r.push_back(AttentionBwdRoute::Kernel);
    return r;
  }
  if (!sm90_first && cudnn && !c.accumulate && !c.f32_grads && rows && (!o.deterministic || fits))
    r.push_back(AttentionBwdRoute::CudnnInPlace);
  if (!rows) {  // nothing to add (overwritten gradients are zeroed)
    r.push_back(AttentionBwdRoute::NoRows);
    return r;
  }
  if (sm90_first) r.push_back(AttentionBwdRoute::Sm90Kernel);
  if (cudnn) r.push_back(fits ? AttentionBwdRoute::CudnnOneCall : AttentionBwdRoute::CudnnTiles);
  if (o.sm90 && !sm90_first) r.push_back(AttentionBwdRoute::Sm90Kernel);
  r.push_back(AttentionBwdRoute::Kernel);
  return r;
}

AttentionFwdRoute attention_fwd_route(const AttentionCall& c, const AttentionRouteOptions& o) {
  return attention_fwd_routes(c, o).front();
}
AttentionBwdRoute attention_bwd_route(const AttentionCall& c, const AttentionRouteOptions& o) {
  return attention_bwd_routes(c, o).front();
}

std::string describe_attention_route(const AttentionCall& c, const AttentionRouteOptions& o) {
  const AttentionFwdRoute f = attention_fwd_route(c, o);
  const AttentionBwdRoute b = attention_bwd_route(c, o);
  std::string s = std::string("forward: ") + route_name(f);
  if (c.windowed()) s += " (window " + std::to_string(c.window) + ")";
  if (f == AttentionFwdRoute::CudnnCausalChunks) s += " (" + std::to_string(causal_chunk_rows(c.sq)) + " rows each)";
  s += std::string("; backward: ") + route_name(b);
  const std::string mode = o.deterministic ? "deterministic" : "atomic dQ";
  if (b == AttentionBwdRoute::CudnnTiles) {
    const int64_t T = o.tile(), nq = (c.sq + T - 1) / T, nk = (c.sk + T - 1) / T;
    s += " (" + std::to_string(T) + " x " + std::to_string(T) + ", " + std::to_string(nq) + " x " + std::to_string(nk) +
         " tiles, " + mode + ")";
  } else if (b == AttentionBwdRoute::CudnnInPlace || b == AttentionBwdRoute::CudnnOneCall ||
             b == AttentionBwdRoute::Sm90Kernel) {
    s += " (" + mode + ")";
  }
  return s;
}

// ---------------------------------------------------------------- scratch

CausalChunkScratch causal_chunk_scratch(const AttentionCall& c) {
  CausalChunkScratch s;
  const int64_t t = causal_chunk_rows(c.sq), H = c.hq, hd = c.hd;
  s.rows = t;
  s.acc_o = t * H * hd * 4;
  s.acc_lse = H * t * 4;
  s.blk_o = t * H * hd * 2;
  s.blk_lse = H * t * 4;
  return s;
}

std::vector<ScratchBuffer> CausalChunkScratch::list() const {
  const std::string t = "attention fwd, query chunks: ", f = " (t = " + std::to_string(rows) + ")";
  return {{t + "chunk output (f32)", acc_o, "4 x t x Hq x hd" + f},
          {t + "chunk LSE", acc_lse, "4 x Hq x t"},
          {t + "part output (bf16)", blk_o, "2 x t x Hq x hd"},
          {t + "part LSE", blk_lse, "4 x Hq x t"}};
}

std::vector<ScratchBuffer> attention_fwd_scratch(AttentionFwdRoute r, const AttentionCall& c) {
  if (r == AttentionFwdRoute::CudnnCausalChunks) return causal_chunk_scratch(c).list();
  return {};
}

// CUDA attention_bwd scratch for one block of b x sq queries and b x sk keys, through
// cuDNN's composite backward, T = ops::attention_bwd_tile: a block of at most T x T is one
// call that keeps the block's bf16 gradients and cuDNN's workspace (softmax sum
// f32[b, Hq, sq]; deterministic: dP bf16[b, Hq, sq, sk], else the dQ accumulator
// f32[b, sq, Hq, hd]); a larger one runs in T x T tiles: bf16 tile gradients, a key tile's
// fp32 dK/dV, the fp32 dQ accumulator of one sequence (unless the gradients are fp32: a
// ring's accumulators) and the workspace of one tile. (A causal square needs the same
// buffers as a full block: it only skips tiles.) Overwriting bf16 gradients (blk.accumulate
// false: LocalAttention's single block): one call writes the gradients in place, no scratch
// but the workspace, for any length with atomic dQ and up to T x T deterministic.
AttentionBwdScratch attention_bwd_scratch(AttentionBwdRoute r, const AttentionCall& c, const AttentionRouteOptions& o) {
  AttentionBwdScratch s;
  s.route = r;
  const bool det = o.deterministic;
  const int64_t T = o.tile(), qrow = c.hq * c.hd, krow = c.hkv * c.hd;
  const int64_t qn = c.batch * c.sq * qrow, kn = c.batch * c.sk * krow;
  const std::string ws_name =
      std::string("attention bwd: cuDNN workspace (softmax sum, ") + (det ? "dP tile)" : "dQ accumulator)");
  const std::string gqa_f = c.hq != c.hkv ? " + 4 x cols x Hq x hd (GQA)" : "";
  const std::string ws_f =
      (det ? "4 x Hq x rows + 2 x Hq x rows x cols" : "4 x Hq x rows + 4 x rows x Hq x hd") + gqa_f;
  switch (r) {
    case AttentionBwdRoute::NoRows: break;
    case AttentionBwdRoute::CudnnInPlace:
      s.cudnn_workspace = {ws_name, cudnn_bwd_workspace(c.batch, c.sq, c.sk, c.hq, c.hkv, c.hd, det),
                           ws_f + " (one call, gradients in place)"};
      break;
    case AttentionBwdRoute::CudnnOneCall:
      s.grads = (qn + 2 * kn) * 2;
      s.cudnn_workspace = {ws_name, cudnn_bwd_workspace(c.batch, c.sq, c.sk, c.hq, c.hkv, c.hd, det), ws_f};
      break;
    case AttentionBwdRoute::CudnnTiles:
      s.tile = T;
      s.grads = T * (qrow + 2 * krow) * 2;
      s.dq_acc = c.f32_grads ? 0 : c.sq * qrow * 4;
      s.dkv_acc = 2 * T * krow * 4;
      s.cudnn_workspace = {ws_name, cudnn_bwd_workspace(1, T, T, c.hq, c.hkv, c.hd, det), ws_f};
      break;
    case AttentionBwdRoute::Kernel:
      s.grads = c.f32_grads ? (qn + 2 * kn) * 2 : 0;
      s.delta = c.batch * c.hq * c.sq * 4;
      break;
    case AttentionBwdRoute::Sm90Kernel:
      s.grads = c.f32_grads ? (qn + 2 * kn) * 2 : 0;
      s.sm90 = kernels::sm90_bwd_scratch_layout(c.batch, c.hq, c.sq, c.hd).total;
      break;
  }
  return s;
}

std::vector<ScratchBuffer> AttentionBwdScratch::list() const {
  std::vector<ScratchBuffer> v;
  auto add = [&](const char* name, int64_t bytes, const std::string& f) {
    if (bytes > 0) v.push_back({std::string("attention bwd: ") + name, bytes, f});
  };
  switch (route) {
    case AttentionBwdRoute::NoRows:
    case AttentionBwdRoute::CudnnInPlace: break;
    case AttentionBwdRoute::CudnnOneCall: add("bf16 block gradients", grads, "2 x (q + 2 k) block elements"); break;
    case AttentionBwdRoute::CudnnTiles:
      add("bf16 tile gradients", grads, "2 x T x (Hq + 2 Hkv) x hd, T = " + std::to_string(tile));
      add("dQ accumulator (f32)", dq_acc, "4 x S x Hq x hd");
      add("dK/dV of a key tile (f32)", dkv_acc, "2 x 4 x T x Hkv x hd");
      break;
    case AttentionBwdRoute::Kernel:
      add("bf16 block gradients (kernel, f32 gradients)", grads, "2 x (q + 2 k) block elements");
      add("delta (f32)", delta, "4 x B x Hq x Sq");
      break;
    case AttentionBwdRoute::Sm90Kernel:
      add("bf16 block gradients (sm90 kernel, f32 gradients)", grads, "2 x (q + 2 k) block elements");
      add("sm90 kernel: dQ accumulator (f32), lse2, delta, semaphores", sm90,
          "4 x B x Hq x Sq_pad x (hd + 2) + 4 x B x Hq x Sq_pad / 64, Sq_pad = Sq rounded up to 64");
      break;
  }
  if (cudnn_workspace.bytes > 0) v.push_back(cudnn_workspace);
  return v;
}

int64_t cudnn_bwd_workspace(int64_t bb, int64_t rows, int64_t cols, int64_t hq, int64_t hkv, int64_t hd, bool det) {
  auto up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
  const int64_t qrow = hq * hd;
  // cuDNN's own part with GQA: the per-query-head dK/dV of the graph, bf16[2, b, Hq, cols,
  // hd] before the group reduction (measured on H200: the 1B shape's peak grows by 4 S Hq hd
  // bytes over the tiles' sum, the 7B's MHA by nothing).
  return up(4 * bb * hq * rows, 256) + (det ? 2 * bb * hq * up(rows, 64) * up(cols, 64) : 4 * bb * rows * qrow) +
         (hq != hkv ? 4 * bb * cols * qrow : 0);
}

}  // namespace easyctx::ops
