// The ops interface: every numeric step of the Llama forward and backward, one virtual call
// each, on Tensor views. Backends: cpu/ (reference; fp32, plus fp64 for gradient checks and
// the golden test) and later cuda/ (bf16 storage, fp32 accumulation, device pointers, the
// backend's current stream). Model code never names a backend: it holds a Backend&.
//
// Conventions shared by every backend:
//  - Row-major, contiguous views; "n" is tokens (batch * sequence rows), D the hidden size.
//  - Linear weights are stored as Hugging Face does, W[out, in], so y = x W^T.
//  - Backward ops *accumulate* into parameter gradients (dW += ...); activation gradients
//    are overwritten unless the op says it accumulates.
//  - Softmax statistics (attention LSE, RMSNorm rstd) are fp32 for fp32/bf16 data; the fp64
//    reference keeps them in fp64 so finite-difference checks stay meaningful.
//  - Every reduction runs in a fixed order: a rerun is bit-identical.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/fence.h"
#include "ops/tensor.h"

namespace easyctx::ops {

// One block of attention, so a sequence-parallel strategy (zigzag ring, Ulysses) can call
// the same kernel on sub-blocks: query row i sits at global position q_offset + i, key row
// j at k_offset + j; with `causal`, key j is visible to query i iff k_pos <= q_pos. A block
// where a query sees no key at all gets o = 0 and lse = -inf (the merge handles it).
struct AttentionBlock {
  double scale = 0;  // softmax scale, usually 1/sqrt(head_dim)
  bool causal = true;
  int64_t q_offset = 0;
  int64_t k_offset = 0;
  // attention_bwd: true adds into dq/dk/dv (a ring's steps sum); false overwrites them (one
  // block covers every key: the CUDA backend then lets cuDNN write them in place).
  bool accumulate = true;
  // Sliding window (the model's sliding_window, Mistral's): > 0, the query at position p sees
  // the keys at positions > p - window only (transformers' kv_idx > q_idx - sliding_window),
  // positions as q_offset/k_offset count them, causal or not. 0: no window. The CUDA backend
  // runs it on its own kernels (ops/attention_route.h), which skip the key tiles before the window.
  int64_t window = 0;
};

// Sum of next-token NLL over the labelled tokens (label >= 0) and their count; the caller
// divides (by the global count, so the loss is the mean over the whole global batch).
struct LossSums {
  double sum_nll = 0;
  int64_t count = 0;
};

// One AdamW update (PyTorch semantics: decoupled decay p *= 1 - lr*wd, bias-corrected
// moments); step counts from 1.
struct AdamWStep {
  double lr = 0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0;
  int64_t step = 1;
};

// What a backend has allocated, in bytes (lib/plan predicts the same quantities):
//  live_bytes          Buffers from alloc() not yet freed, plus the backend's own
//                      allocations (CUDA: cuBLASLt/cuDNN workspaces, scratch in flight).
//  peak_bytes          high-water mark of live_bytes since creation or reset_peak_memory().
//  scratch_peak_bytes  CUDA: high-water mark of the memory the stream-ordered pool reserved
//                      for scratch (cudaMemPoolAttrReservedMemHigh: what the pool holds from
//                      the driver, fragmentation included); 0 on the CPU, whose kernels keep
//                      their small scratch on the heap, outside these counts.
struct MemoryStats {
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t scratch_peak_bytes = 0;
};

struct AttentionCall;  // the shape of an attention call (ops/attention_route.h)

// The completion of one Backend::copy_async, for wait_copy (seq 0: nothing to wait for).
struct CopyFence {
  int64_t seq = 0;
};

// Marks around ops, ordered like a backend's work (Backend::make_op_timer; the per-op
// profile of lib/ops/profile.h). begin() and end() bracket one op; collect() waits for the
// marked work and returns each pair's milliseconds in order, then starts over.
class OpTimer {
 public:
  virtual ~OpTimer() = default;
  virtual void begin() = 0;
  virtual void end() = 0;
  virtual std::vector<double> collect() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual MemSpace memspace() const = 0;
  // Zero-filled buffer of numel elements in this backend's memory space.
  // `what` names the buffer for the memory plan, which replays the allocating code on a
  // recording backend (lib/plan/recorder.h); other backends ignore it.
  Buffer alloc(DType t, int64_t numel, const char* what = nullptr) { return allocate(t, numel, what); }
  virtual Buffer allocate(DType t, int64_t numel, const char* what) = 0;
  // Waits for queued work (device backends); the CPU backend runs synchronously.
  virtual void synchronize() {}
  // Allocation counters (thread-safe); reset_peak_memory() restarts the high-water marks
  // from what is live now.
  virtual MemoryStats memory_stats() const = 0;
  virtual void reset_peak_memory() = 0;
  // The backend that does the work (a wrapper such as ProfilingBackend returns the one it wraps).
  virtual Backend& base() { return *this; }
  // Marks for timing ops (default: the host's wall clock, right for synchronous backends;
  // CUDA: events on the backend's stream).
  virtual std::unique_ptr<OpTimer> make_op_timer();

  // ---- ordering with other queues (core/fence.h)
  // The queue the ops are issued to (CUDA: the compute stream; CPU: the host, synchronous).
  virtual Queue& queue();
  // A fence after every op issued so far; ops issued from now on run after `f` (CUDA: on the
  // device, the host does not block).
  Fence record() { return queue().record(); }
  void wait(const Fence& f) { queue().wait(f); }
  // A queue beside the compute queue (CUDA: a stream, of the highest priority when asked; CPU:
  // the host), ordered with it by fences only: communicators issue to it (Comm::set_queue).
  virtual std::unique_ptr<Queue> make_queue(bool high_priority = false);
  // Makes the calling host thread issue to this backend's device (CUDA: cudaSetDevice; the
  // current device is per thread); call it first on a thread that issues work.
  virtual void bind_thread() {}
  // dst = src (same dtype and size, any memory spaces of this backend) issued to `q`, one of
  // this backend's queues; returns at once (the CPU backend copies before returning).
  virtual void copy_on(Queue& q, const Tensor& dst, const Tensor& src) = 0;

  // ---- copies that overlap compute (activation.offload: checkpoints in host memory)
  // Zero-filled page-locked host buffer the device copies to and from asynchronously (CUDA:
  // cudaHostAlloc, outside memory_stats(), which counts device memory; CPU: alloc()).
  Buffer alloc_host_pinned(DType t, int64_t numel, const char* what = nullptr) {
    return allocate_host_pinned(t, numel, what);
  }
  virtual Buffer allocate_host_pinned(DType t, int64_t numel, const char* what) = 0;
  // dst = src (same dtype and size; host memory from alloc_host_pinned, or this backend's) on
  // the backend's copy stream, after everything queued so far; returns at once (the CPU
  // backend copies before returning). Work queued later, and synchronize(), see the copy
  // finished only after wait_copy(fence). (A CopyFence is a sequence number on the copy
  // stream: no event per copy, for the many small copies of activation offload.)
  virtual CopyFence copy_async(const Tensor& dst, const Tensor& src) = 0;
  // Work queued after this call runs after the copy behind `f` has finished (CUDA: the
  // compute stream waits on the device, the host does not block; CPU: nothing to wait for).
  virtual void wait_copy(CopyFence f) = 0;

  // ---- elementwise and reductions (any shape; dtypes must match unless noted)
  // dst = src; converts between dtypes (e.g. fp32 master -> bf16 working copy) and copies
  // across memory spaces.
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;
  // Strided copy, same dtype and memory space: `rows` rows of `width` elements; row r of dst
  // starts r * dst_pitch elements after dst.data, of src r * src_pitch after src.data (each
  // view must hold its last row). Packs a range of heads out of [n, H, hd] and back in one
  // call (attention::HeadGroupedAttention; CUDA: one cudaMemcpy2DAsync).
  virtual void copy_2d(const Tensor& dst, int64_t dst_pitch, const Tensor& src, int64_t src_pitch, int64_t rows,
                       int64_t width) = 0;
  virtual void fill(const Tensor& x, double value) = 0;
  virtual void axpy(const Tensor& y, const Tensor& x, double alpha) = 0;  // y += alpha x
  virtual void scale(const Tensor& x, double alpha) = 0;                  // x *= alpha
  virtual double sum_squares(const Tensor& x) = 0;                        // sum x^2, in fp64

  // ---- token embedding: ids i32[n], table [V, D], out [n, D]
  virtual void embedding_fwd(const Tensor& ids, const Tensor& table, const Tensor& out) = 0;
  // dtable[ids[i]] += dout[i]
  virtual void embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dtable) = 0;

  // ---- RMSNorm (HF): y = w * x / sqrt(mean(x^2) + eps); x, y [n, D], w [D], rstd [n]
  virtual void rmsnorm_fwd(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd) = 0;
  // dx += d/dx, dw += d/dw (dx accumulates: it is the residual stream's gradient).
  virtual void rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                           const Tensor& dw) = 0;

  // ---- C = alpha * op(A) op(B) + beta * C, 2-D views; op(X) = X^T when trans_x.
  virtual void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, double alpha = 1.0,
                      double beta = 0.0) = 0;

  // ---- RoPE in HF's half-split layout, in place: x [n, H, hd], positions i32[n],
  // inv_freq f32[hd/2] (the model's frequencies after rope_scaling). Pair (i, i + hd/2) of
  // token t turns by angle positions[t] * inv_freq[i], computed in fp32 like HF and vLLM.
  // inverse = true turns the other way (the backward of a rotation is its inverse).
  virtual void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, bool inverse) = 0;

  // ---- attention on one block, native GQA (Hq a multiple of Hkv; q head h reads kv head
  // h / (Hq / Hkv)). q [B, Sq, Hq, hd], k/v [B, Sk, Hkv, hd], o [B, Sq, Hq, hd],
  // lse [B, Hq, Sq] (natural log of the softmax denominator of the scaled scores).
  virtual void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionBlock& blk,
                             const Tensor& o, const Tensor& lse) = 0;
  // Given the *final* o and lse of the rows (after any merge across blocks), adds this
  // block's contribution: dq += ..., dk += ..., dv += ... (accumulating, so ring steps sum;
  // with blk.accumulate false: dq = ..., dk = ..., dv = ...).
  virtual void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                             const Tensor& dout, const AttentionBlock& blk, const Tensor& dq, const Tensor& dk,
                             const Tensor& dv) = 0;
  // The route this backend's attention_fwd (backward false) or attention_bwd would take for
  // a call of this shape (the router of ops/attention_route.h with the backend's options; at
  // run time the CUDA backend may still fall back where cuDNN declines), for logs and the
  // per-op profile. "" (the default) where the backend has one way only (the CPU).
  virtual std::string attention_route(const AttentionCall& call, bool backward) const;
  // Merges a block result into the running one: lse = log(e^lse + e^lse_blk),
  // o = o e^(lse_old - lse) + o_blk e^(lse_blk - lse). Shapes as attention_fwd's outputs.
  virtual void attention_merge(const Tensor& o, const Tensor& lse, const Tensor& o_blk, const Tensor& lse_blk) = 0;

  // ---- SwiGLU: h = silu(g) * u; g, u, h [n, I]
  virtual void swiglu_fwd(const Tensor& g, const Tensor& u, const Tensor& h) = 0;
  virtual void swiglu_bwd(const Tensor& g, const Tensor& u, const Tensor& dh, const Tensor& dg, const Tensor& du) = 0;

  // ---- LM head + cross entropy, tiled along tokens so full logits never exist:
  // x [n, D] (final-normed hidden), w [V, D], labels i32[n] (-1: ignored). Returns the NLL
  // sum and label count of the tile rows. If dx is not empty it also runs the backward of
  // grad_scale * sum_nll: dx [n, D] is overwritten, dw [V, D] accumulates (dw may be empty).
  virtual LossSums lm_head_loss(const Tensor& x, const Tensor& w, const Tensor& labels, int64_t tile_tokens,
                                double grad_scale, const Tensor& dx, const Tensor& dw) = 0;
  // ---- LM-head scoring for evaluations (no gradient), tiled along the rows like lm_head_loss
  // so full logits never exist: x [n, D], w [V, D], labels i32[n] (-1: not scored) in this
  // backend's memory; nll f64[n] and top i32[n] in host memory. For each row with a label:
  // nll = logsumexp(logits) - logits[label], computed as lm_head_loss computes it (so sums of
  // it agree with lm_head_loss's bit for bit on the same backend), and top = 1 when the label
  // is the row's argmax (the first index of the largest logit, as torch.argmax), else 0;
  // rows without a label get 0 and 0. (Default: throws; the CPU and CUDA backends have it.)
  virtual void lm_head_score(const Tensor& x, const Tensor& w, const Tensor& labels, int64_t tile_tokens,
                             const Tensor& nll, const Tensor& top);

  // ---- optimizer on fp32 master weights: param, grad, m, v same shape.
  virtual void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWStep& s) = 0;
};

// The CPU reference backend: host memory, fp32 and fp64, OpenMP across rows.
std::unique_ptr<Backend> make_cpu_backend();

// Rows per query chunk of the CUDA backend's causal squares (a whole causal block of one
// sequence, S x S): the keys before a chunk run through cuDNN's fused SDPA without a mask,
// the chunk's own t x t diagonal through the causal kernel. Used for S >= 2t and batch 1;
// the memory plan reads it too.
inline int64_t causal_chunk_rows(int64_t s) {
  const int64_t t = ((s / 16 + 127) / 128) * 128;
  return t < 1024 ? 1024 : (t > 8192 ? 8192 : t);
}
// Rows and columns of the tiles the CUDA backend's attention backward splits a block larger
// than one tile into (cuDNN's composite backward): the deterministic graph keeps the tile's
// dP (bf16[Hq, T, T]) in cuDNN's workspace, hence its smaller tile. `requested` > 0 wins
// (CudaBackendOptions::attention_bwd_tile). The memory plan reads it.
inline int64_t attention_bwd_tile(bool deterministic, int64_t requested = 0) {
  return requested > 0 ? requested : (deterministic ? 4096 : 8192);
}

// The same counters summed over every CPU backend of the process (for code that cannot
// reach the backend, e.g. a test measuring a Trainer); scratch_peak_bytes is 0.
MemoryStats cpu_process_memory_stats();
void reset_cpu_process_peak_memory();

}  // namespace easyctx::ops
