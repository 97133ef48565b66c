#include "ops/cuda/cuda_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_sm90.h"
#include "kernels/cuda_check.h"
#include "kernels/kernels.h"
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cudnn_attention.h"

namespace easyctx::ops::cuda {

kernels::AttentionParams attention_params(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                          const AttentionBlock& blk) {
  for (const Tensor* t : {&q, &k, &v}) check_type(op, "q/k/v", *t, DType::BF16);
  EASYCTX_CHECK(q.ndim == 4 && k.ndim == 4 && v.ndim == 4, op, ": q, k, v must be [B, S, H, hd], got ", q.describe(),
                " ", k.describe(), " ", v.describe());
  const AttentionCall c = attention_call(q, k, blk);  // (the router's view of the same call)
  kernels::AttentionParams p;
  p.batch = c.batch, p.sq = c.sq, p.sk = c.sk;
  p.hq = c.hq, p.hkv = c.hkv, p.hd = c.hd;
  EASYCTX_CHECK(k.shape == v.shape && k.dim(0) == p.batch && k.dim(3) == p.hd, op, ": k ", k.describe(), " / v ",
                v.describe(), " do not match q ", q.describe());
  EASYCTX_CHECK(p.hkv > 0 && p.hq % p.hkv == 0, op, ": query heads ", p.hq, " not a multiple of kv heads ", p.hkv);
  EASYCTX_CHECK(p.hd == 64 || p.hd == 128, op, " (CUDA): head dim ", p.hd, " not supported (64 or 128)");
  p.q = static_cast<const bf16*>(q.data);
  p.k = static_cast<const bf16*>(k.data);
  p.v = static_cast<const bf16*>(v.data);
  p.q_row = p.hq * p.hd;
  p.q_batch = p.sq * p.q_row;
  p.k_row = p.hkv * p.hd;
  p.k_batch = p.sk * p.k_row;
  p.scale = static_cast<float>(blk.scale);
  p.scale_log2 = static_cast<float>(blk.scale * 1.4426950408889634);
  p.causal = blk.causal;
  p.diag = blk.q_offset - blk.k_offset;
  p.window = c.window;  // (0 where the window hides no key from any query of the block)
  return p;
}

namespace {

// The router's view of a checked call.
AttentionCall call_of(const kernels::AttentionParams& p, const AttentionBlock& blk, bool f32_grads) {
  AttentionCall c;
  c.batch = p.batch;
  c.sq = p.sq;
  c.sk = p.sk;
  c.hq = p.hq;
  c.hkv = p.hkv;
  c.hd = p.hd;
  c.causal = p.causal;
  c.diag = p.diag;
  c.f32_grads = f32_grads;
  c.accumulate = blk.accumulate;
  c.window = p.window;
  return c;
}

SdpaShape shape_of(const kernels::AttentionParams& p) { return {p.batch, p.sq, p.sk, p.hq, p.hkv, p.hd}; }

}  // namespace

CudaAttention::CudaAttention(Backend& backend, cudaStream_t stream, std::shared_ptr<MemoryCounter> mem,
                             const AttentionRouteOptions& opts)
    : be_(backend), stream_(stream), mem_(std::move(mem)), opts_(opts) {
  EASYCTX_CHECK(opts.bwd_tile == 0 || (opts.bwd_tile >= 128 && opts.bwd_tile % 128 == 0),
                "CudaBackendOptions::attention_bwd_tile must be 0 or a positive multiple of 128, got ", opts.bwd_tile);
}

CudaAttention::~CudaAttention() {
  cudnn_.reset();
  mem_->sub(cudnn_ws_counted_);
}

std::string CudaAttention::route(const AttentionCall& c, bool backward) const {
  return backward ? route_name(attention_bwd_route(c, opts_)) : route_name(attention_fwd_route(c, opts_));
}

std::string CudaAttention::path() const {
  return last_path_ + (cudnn_decline_.empty() ? "" : " (cuDNN declined: " + cudnn_decline_ + ")");
}

// ---------------------------------------------------------------- forward
void CudaAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionBlock& blk,
                            const Tensor& o, const Tensor& lse) {
  kernels::AttentionParams p = attention_params("attention_fwd", q, k, v, blk);
  check_type("attention_fwd", "o", o, DType::BF16);
  check_type("attention_fwd", "lse", lse, DType::F32);
  check_numel("attention_fwd", "o", o, q.numel());
  check_numel("attention_fwd", "lse", lse, p.batch * p.hq * p.sq);
  p.o_out = static_cast<bf16*>(o.data);
  p.lse_out = lse.ptr<float>();
  const AttentionCall c = call_of(p, blk, false);
  for (const AttentionFwdRoute r : attention_fwd_routes(c, opts_)) {
    switch (r) {
      case AttentionFwdRoute::NoKeys:  // no keys at all: every row is empty
        be_.fill(o, 0.0);
        be_.fill(lse, -INFINITY);
        return;
      case AttentionFwdRoute::Sm90Kernel:
        // (a shape TMA cannot load, e.g. a view whose strides are not 16-byte multiples, goes on)
        if (!kernels::attention_fwd_sm90_supported(p)) break;
        kernels::attention_fwd_sm90(p, stream_);
        last_path_ = "sm90 kernel";
        return;
      case AttentionFwdRoute::CudnnCausalGraph:
        if (causal_square_cudnn(p)) return;
        break;
      case AttentionFwdRoute::CudnnCausalChunks:
        if (causal_in_chunks(p, c)) return;
        break;
      case AttentionFwdRoute::CudnnUnmasked:
        if (unmasked_cudnn(p)) return;
        break;
      case AttentionFwdRoute::Kernel:
        note_decline();
        kernels::attention_fwd(p, stream_);
        last_path_ = "kernel";
        return;
    }
  }
}

// A whole causal square (q and k at the same positions) in one call of cuDNN's composite
// causal forward graph; false (nothing written) when cuDNN is off or has no plan.
bool CudaAttention::causal_square_cudnn(const kernels::AttentionParams& p) {
  if (!opts_.cudnn) return false;
  if (!aligned16({p.q, p.k, p.v, p.o_out, p.lse_out})) return false;
  SdpaShape sh = shape_of(p);
  sh.causal = true;
  if (!cudnn() || !cudnn()->has_fwd_plan(sh)) {
    note_decline();
    return false;
  }
  if (!after_cudnn(cudnn()->try_fwd(sh, p.scale, p.q, p.k, p.v, p.o_out, p.lse_out, stream_))) return false;
  last_path_ = "cudnn (causal graph)";
  return true;
}

// A whole causal square (one GPU's sequence, a ring's step 0) in query chunks of t rows,
// where cuDNN declines its causal graph (or CudaBackendOptions::cudnn_causal_graph is off):
// chunk i's keys before it form a block without a mask, which cuDNN's fused SDPA runs at
// its full rate, and only its own t x t diagonal square needs the causal kernel; the two
// partial results merge by LSE in fp32 (the diagonal squares are t/S of the work).
// Returns false (nothing written) where cuDNN is off or declines the shape.
bool CudaAttention::causal_in_chunks(const kernels::AttentionParams& p, const AttentionCall& c) {
  if (!opts_.cudnn) return false;
  const CausalChunkScratch s = causal_chunk_scratch(c);
  const int64_t S = p.sq, t = s.rows, H = p.hq, hd = p.hd;
  if (!aligned16({p.q, p.k, p.v, p.o_out})) return false;
  if (!cudnn() || !cudnn()->has_fwd_plan({1, t, t, p.hq, p.hkv, p.hd})) return false;
  Scratch acc_o(s.acc_o, stream_, *mem_);    // f32 [t, H, hd]
  Scratch acc_l(s.acc_lse, stream_, *mem_);  // f32 [H, t]
  Scratch blk_o(s.blk_o, stream_, *mem_);    // bf16 [t, H, hd]
  Scratch blk_l(s.blk_lse, stream_, *mem_);  // f32 [H, t]
  for (int64_t r0 = 0; r0 < S; r0 += t) {
    const int64_t rows = std::min(t, S - r0);
    kernels::AttentionParams d = p;  // the diagonal square [r0, r0 + rows)
    d.q = p.q + r0 * p.q_row;
    d.k = p.k + r0 * p.k_row;
    d.v = p.v + r0 * p.k_row;
    d.sq = d.sk = rows;
    d.q_batch = rows * p.q_row;
    d.k_batch = rows * p.k_row;
    d.o_out = r0 == 0 ? p.o_out : blk_o.as<bf16>();
    d.lse_out = acc_l.as<float>();
    kernels::attention_fwd(d, stream_);
    if (r0 > 0) {
      const Tensor ao(acc_o.as<float>(), DType::F32, {1, rows, H, hd}, MemSpace::Device);
      const Tensor al(acc_l.as<float>(), DType::F32, {1, H, rows}, MemSpace::Device);
      const Tensor bo(blk_o.as<bf16>(), DType::BF16, {1, rows, H, hd}, MemSpace::Device);
      const Tensor bl(blk_l.as<float>(), DType::F32, {1, H, rows}, MemSpace::Device);
      be_.copy(ao, bo);  // the diagonal part, widened to the fp32 accumulator
      // Keys [0, r0): no mask. cuDNN when it has a plan, else our kernel (a non-causal block).
      if (!cudnn()->try_fwd({1, rows, r0, p.hq, p.hkv, p.hd}, p.scale, d.q, p.k, p.v, bo.data, bl.ptr<float>(),
                            stream_)) {
        kernels::AttentionParams pre = d;
        pre.k = p.k;
        pre.v = p.v;
        pre.sk = r0;
        pre.k_batch = r0 * p.k_row;
        pre.causal = false;
        pre.o_out = blk_o.as<bf16>();
        pre.lse_out = blk_l.as<float>();
        kernels::attention_fwd(pre, stream_);
      }
      be_.attention_merge(ao, al, bo, bl);
      be_.copy(Tensor(p.o_out + r0 * p.q_row, DType::BF16, {1, rows, H, hd}, MemSpace::Device), ao);
    }
    // This chunk's LSE rows into lse [H, S] (row stride S).
    EASYCTX_CUDA_CHECK(cudaMemcpy2DAsync(p.lse_out + r0, static_cast<size_t>(S) * sizeof(float), acc_l.as<float>(),
                                         static_cast<size_t>(rows) * sizeof(float),
                                         static_cast<size_t>(rows) * sizeof(float), static_cast<size_t>(H),
                                         cudaMemcpyDeviceToDevice, stream_));
  }
  last_path_ = "cudnn+kernel (causal in chunks)";
  return true;
}

// A block every query of which sees every key (not causal, or causal with every key visible
// to every row) through cuDNN's fused SDPA, where its buffers are 16-byte aligned.
bool CudaAttention::unmasked_cudnn(const kernels::AttentionParams& p) {
  if (!opts_.cudnn) return false;
  if (!aligned16({p.q, p.k, p.v, p.o_out, p.lse_out})) return false;
  if (!cudnn()) return false;
  if (!after_cudnn(cudnn()->try_fwd(shape_of(p), p.scale, p.q, p.k, p.v, p.o_out, p.lse_out, stream_))) return false;
  last_path_ = "cudnn";
  return true;
}

// ---------------------------------------------------------------- backward
void CudaAttention::backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                             const Tensor& dout, const AttentionBlock& blk, const Tensor& dq, const Tensor& dk,
                             const Tensor& dv) {
  kernels::AttentionParams p = attention_params("attention_bwd", q, k, v, blk);
  const bool f32_grads = dq.dtype == DType::F32 && dk.dtype == DType::F32 && dv.dtype == DType::F32;
  for (const Tensor* t : {&o, &dout}) check_type("attention_bwd", "o/dout", *t, DType::BF16);
  for (const Tensor* t : {&dq, &dk, &dv}) {
    if (f32_grads) check_device("attention_bwd", *t);
    else check_type("attention_bwd", "dq/dk/dv (all bf16 or all f32)", *t, DType::BF16);
  }
  check_type("attention_bwd", "lse", lse, DType::F32);
  for (const Tensor* t : {&o, &dout, &dq}) check_numel("attention_bwd", "o/dout/dq", *t, q.numel());
  for (const Tensor* t : {&dk, &dv}) check_numel("attention_bwd", "dk/dv", *t, k.numel());
  check_numel("attention_bwd", "lse", lse, p.batch * p.hq * p.sq);
  p.o = static_cast<const bf16*>(o.data);
  p.dout = static_cast<const bf16*>(dout.data);
  p.lse = lse.ptr<float>();
  const AttentionCall c = call_of(p, blk, f32_grads);
  const std::vector<AttentionBwdRoute> routes = attention_bwd_routes(c, opts_);
  size_t i = 0;
  if (routes[i] == AttentionBwdRoute::CudnnInPlace) {
    if (cudnn_bwd_in_place(p, c, dq, dk, dv)) return;
    ++i;
  }
  if (!blk.accumulate)
    for (const Tensor* t : {&dq, &dk, &dv}) be_.fill(*t, 0.0);
  for (; i < routes.size(); ++i) {
    switch (routes[i]) {
      case AttentionBwdRoute::NoRows: return;
      case AttentionBwdRoute::CudnnInPlace: break;  // (only ever first)
      case AttentionBwdRoute::Sm90Kernel:
        if (sm90_bwd(p, c, dq, dk, dv)) return;
        break;
      case AttentionBwdRoute::CudnnOneCall:
        if (cudnn_bwd_one_call(p, c, dq, dk, dv)) return;
        break;
      case AttentionBwdRoute::CudnnTiles:
        if (cudnn_bwd_tiles(p, c, dq, dk, dv)) return;
        break;
      case AttentionBwdRoute::Kernel: kernel_bwd(p, c, dq, dk, dv); return;
    }
  }
}

// attention_bwd that overwrites bf16 gradients (blk.accumulate false: one block covers the
// keys, LocalAttention): one call of cuDNN's composite backward writing dq/dk/dv in place,
// no scratch and no tiles. Atomic dQ: any length (cuDNN's workspace holds the f32 dQ
// accumulator of the block, as the tiled path's own accumulator would); deterministic: up
// to a T x T block (its dP lives in the workspace). false: nothing written (the caller
// zeroes the gradients and takes the accumulating path).
bool CudaAttention::cudnn_bwd_in_place(const kernels::AttentionParams& p, const AttentionCall& c, const Tensor& dq,
                                       const Tensor& dk, const Tensor& dv) {
  if (!opts_.cudnn) return false;
  const bool full = c.unmasked();  // else a causal square
  if (!aligned16({p.q, p.k, p.v, p.o, p.dout, p.lse, dq.data, dk.data, dv.data})) return false;
  if (!cudnn()) return false;
  const SdpaShape shape{p.batch, p.sq, p.sk, p.hq, p.hkv, p.hd, !full, 0, opts_.deterministic};
  if (!cudnn()->has_bwd_plan(shape)) return false;
  if (!after_cudnn(
          cudnn()->try_bwd(shape, p.scale, p.q, p.k, p.v, p.o, p.lse, p.dout, dq.data, dk.data, dv.data, stream_)))
    return false;
  last_path_ = std::string("cudnn (one call, in place") + (opts_.deterministic ? "" : ", atomic dQ") + ")";
  return true;
}

// The backward of one block of at most T x T (T = the backward tile) through cuDNN's fused
// (composite) backward graph: one call into bf16 scratch that is added into the gradients.
// false, with nothing written, where cuDNN declines or the buffers are not aligned.
bool CudaAttention::cudnn_bwd_one_call(const kernels::AttentionParams& p, const AttentionCall& c, const Tensor& dq,
                                       const Tensor& dk, const Tensor& dv) {
  if (!opts_.cudnn) return false;
  const bool full = c.unmasked();
  if (!aligned16({p.q, p.k, p.v, p.o, p.dout, p.lse})) return false;
  if (!cudnn()) return false;
  const int64_t qn = p.batch * p.sq * p.hq * p.hd, kn = p.batch * p.sk * p.hkv * p.hd;
  const SdpaShape shape{p.batch, p.sq, p.sk, p.hq, p.hkv, p.hd, !full, 0, opts_.deterministic};
  if (!cudnn()->has_bwd_plan(shape)) return false;
  const AttentionBwdScratch s = attention_bwd_scratch(AttentionBwdRoute::CudnnOneCall, c, opts_);
  Scratch g(s.grads, stream_, *mem_);
  bf16* gq = g.as<bf16>();
  if (!after_cudnn(
          cudnn()->try_bwd(shape, p.scale, p.q, p.k, p.v, p.o, p.lse, p.dout, gq, gq + qn, gq + qn + kn, stream_)))
    return false;
  add_into(dq, 0, gq, qn);
  add_into(dk, 0, gq + qn, kn);
  add_into(dv, 0, gq + qn + kn, kn);
  last_path_ = std::string("cudnn") + (opts_.deterministic ? "" : " (atomic dQ)");
  return true;
}

// A block larger than T x T (one GPU's causal sequence, a ring's blocks) through cuDNN's
// composite backward, per sequence of the batch in T x T tiles, key tile by key tile (a
// causal square: only tiles on or below the diagonal, the diagonal ones causal): tile j's
// dK/dV sum every query tile's contribution in fp32 and are added once; dQ sums in an fp32
// accumulator over the block (the gradient itself when it is fp32, a ring's accumulator), so
// no gradient is rounded more than once per call and the scratch stays bounded by the tile.
// Every shape is planned before anything is written; false, with nothing written, where
// cuDNN declines one or the buffers are not aligned.
bool CudaAttention::cudnn_bwd_tiles(const kernels::AttentionParams& p, const AttentionCall& c, const Tensor& dq,
                                    const Tensor& dk, const Tensor& dv) {
  if (!opts_.cudnn) return false;
  const bool full = c.unmasked();
  if (!aligned16({p.q, p.k, p.v, p.o, p.dout, p.lse})) return false;
  if (!cudnn()) return false;
  const bool det = opts_.deterministic;
  const AttentionBwdScratch s = attention_bwd_scratch(AttentionBwdRoute::CudnnTiles, c, opts_);
  const int64_t T = s.tile, H = p.hq, Hk = p.hkv, hd = p.hd;
  const int64_t qrow = H * hd, krow = Hk * hd;
  const int64_t S = p.sq, Sk = p.sk, nq = (S + T - 1) / T, nk = (Sk + T - 1) / T;
  const int64_t lastq = S - (nq - 1) * T, lastk = Sk - (nk - 1) * T;
  auto shape = [&](int64_t rows, int64_t cols, bool causal) {
    return SdpaShape{1, rows, cols, H, Hk, hd, causal, S, det};
  };
  std::vector<SdpaShape> need;
  if (full) {
    for (int64_t r : {T, lastq})
      for (int64_t col : {T, lastk}) need.push_back(shape(r, col, false));
  } else {
    need = {shape(T, T, true), shape(T, T, false), shape(lastq, T, false), shape(lastq, lastq, true)};
  }
  for (const auto& sh : need)
    if (!cudnn()->has_bwd_plan(sh)) return false;
  Scratch g(s.grads, stream_, *mem_);
  bf16 *gq = g.as<bf16>(), *gk = gq + T * qrow, *gv = gk + T * krow;
  const bool dq_f32 = dq.dtype == DType::F32;
  Scratch dq_acc(s.dq_acc, stream_, *mem_);
  Scratch kv_acc(s.dkv_acc, stream_, *mem_);
  float *dka = kv_acc.as<float>(), *dva = dka + T * krow;
  for (int64_t bi = 0; bi < p.batch; ++bi) {
    const bf16 *q = p.q + bi * S * qrow, *k = p.k + bi * Sk * krow, *v = p.v + bi * Sk * krow;
    const bf16 *o = p.o + bi * S * qrow, *dout = p.dout + bi * S * qrow;
    const float* lse = p.lse + bi * H * S;
    float* dqa = dq_f32 ? dq.ptr<float>() + bi * S * qrow : dq_acc.as<float>();
    if (!dq_f32) EASYCTX_CUDA_CHECK(cudaMemsetAsync(dqa, 0, static_cast<size_t>(s.dq_acc), stream_));
    for (int64_t j = 0; j < nk; ++j) {
      const int64_t k0 = j * T, cols = std::min(T, Sk - k0);
      EASYCTX_CUDA_CHECK(cudaMemsetAsync(dka, 0, static_cast<size_t>(s.dkv_acc), stream_));
      for (int64_t i = full ? 0 : j; i < nq; ++i) {
        const int64_t r0 = i * T, rows = std::min(T, S - r0);
        if (!after_cudnn(cudnn()->try_bwd(shape(rows, cols, !full && i == j), p.scale, q + r0 * qrow, k + k0 * krow,
                                          v + k0 * krow, o + r0 * qrow, lse + r0, dout + r0 * qrow, gq, gk, gv,
                                          stream_)))
          EASYCTX_THROW(process_label(), " cuDNN attention backward: a planned tile shape was declined");
        kernels::axpy(dqa + r0 * qrow, gq, 1.f, rows * qrow, stream_);
        kernels::axpy(dka, gk, 1.f, cols * krow, stream_);
        kernels::axpy(dva, gv, 1.f, cols * krow, stream_);
      }
      add_into(dk, (bi * Sk + k0) * krow, dka, cols * krow);
      add_into(dv, (bi * Sk + k0) * krow, dva, cols * krow);
    }
    if (!dq_f32) add_into(dq, bi * S * qrow, dqa, S * qrow);
  }
  last_path_ = "cudnn (" + std::to_string(nq) + " x " + std::to_string(nk) + " tiles of " + std::to_string(T) +
               (det ? "" : ", atomic dQ") + ")";
  return true;
}

template <typename Run>
void CudaAttention::into_gradients(kernels::AttentionParams& p, const AttentionCall& c, int64_t grads_bytes,
                                   const Tensor& dq, const Tensor& dk, const Tensor& dv, const Run& run) {
  const int64_t qn = dq.numel(), kn = dk.numel();
  Scratch g(grads_bytes, stream_, *mem_);
  if (c.f32_grads) EASYCTX_CUDA_CHECK(cudaMemsetAsync(g.as<bf16>(), 0, static_cast<size_t>(grads_bytes), stream_));
  p.dq = c.f32_grads ? g.as<bf16>() : static_cast<bf16*>(dq.data);
  p.dk = c.f32_grads ? p.dq + qn : static_cast<bf16*>(dk.data);
  p.dv = c.f32_grads ? p.dk + kn : static_cast<bf16*>(dv.data);
  run();
  if (c.f32_grads) {
    add_into(dq, 0, p.dq, qn);
    add_into(dk, 0, p.dk, kn);
    add_into(dv, 0, p.dv, kn);
  }
}

// Our kernels (delta, dK/dV, dQ).
void CudaAttention::kernel_bwd(kernels::AttentionParams& p, const AttentionCall& c, const Tensor& dq, const Tensor& dk,
                               const Tensor& dv) {
  note_decline();
  const AttentionBwdScratch s = attention_bwd_scratch(AttentionBwdRoute::Kernel, c, opts_);
  into_gradients(p, c, s.grads, dq, dk, dv, [&] {
    Scratch delta(s.delta, stream_, *mem_);
    p.delta = delta.as<float>();
    kernels::attention_bwd(p, stream_);
  });
  last_path_ = "kernel";
}

// The Hopper kernel in the backend's mode (kernels::sm90_bwd_variant_for).
bool CudaAttention::sm90_bwd(kernels::AttentionParams& p, const AttentionCall& c, const Tensor& dq, const Tensor& dk,
                             const Tensor& dv) {
  const AttentionBwdScratch s = attention_bwd_scratch(AttentionBwdRoute::Sm90Kernel, c, opts_);
  // Supported? Checked on the call's own pointers (f32 gradients: scratch is 256-byte aligned).
  p.dq = static_cast<bf16*>(dq.data);
  p.dk = static_cast<bf16*>(dk.data);
  p.dv = static_cast<bf16*>(dv.data);
  if (!kernels::attention_bwd_sm90_supported(p)) return false;
  const kernels::Sm90BwdVariant variant = kernels::sm90_bwd_variant_for(opts_.deterministic);
  into_gradients(p, c, s.grads, dq, dk, dv, [&] {
    Scratch k(s.sm90, stream_, *mem_);
    kernels::attention_bwd_sm90(p, k.as<float>(), stream_, variant);
  });
  last_path_ = std::string("sm90 kernel (") + kernels::sm90_bwd_variant_name(variant) + ")";
  return true;
}

// ---------------------------------------------------------------- helpers
template <typename TX>
void CudaAttention::add_into(const Tensor& dst, int64_t offset, const TX* x, int64_t n) {
  if (dst.dtype == DType::F32) kernels::axpy(dst.ptr<float>() + offset, x, 1.f, n, stream_);
  else kernels::axpy(static_cast<bf16*>(dst.data) + offset, x, 1.f, n, stream_);
}

bool CudaAttention::aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* q : ptrs)
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;
  return true;
}

CudnnAttention* CudaAttention::cudnn() {
  if (!cudnn_ && opts_.cudnn) {
    try {
      cudnn_ = std::make_unique<CudnnAttention>();
    } catch (const Error& e) {
      cudnn_decline_ = e.what();
      opts_.cudnn = false;
    }
  }
  return cudnn_.get();
}

bool CudaAttention::after_cudnn(bool ok) {
  const int64_t ws = static_cast<int64_t>(cudnn_->workspace_bytes());
  if (ws > cudnn_ws_counted_) mem_->add(ws - cudnn_ws_counted_);
  cudnn_ws_counted_ = std::max(ws, cudnn_ws_counted_);
  return ok;
}

void CudaAttention::note_decline() {
  if (cudnn_ && !cudnn_->last_decline().empty()) cudnn_decline_ = cudnn_->last_decline();
}

}  // namespace easyctx::ops::cuda
