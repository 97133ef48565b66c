// The CUDA backend: checks shapes and dtypes like the CPU reference, then queues the
// kernels of kernels/ (and cuBLASLt) on its stream. Scratch memory is stream-ordered
// (cudaMallocAsync from the device's pool, kept cached), so no call synchronises except
// those that return host values (sum_squares, lm_head_loss), device-to-host copies and the
// token-id check of embedding_fwd.
#include "ops/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/cuda_queue.h"
#include "kernels/attention_sm90.h"
#include "kernels/cuda_check.h"
#include "kernels/kernels.h"
#include "ops/cuda/cuda_attention.h"
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/lt_matmul.h"
#include "ops/half.h"
#include "ops/memory_counter.h"
#include "ops/scratch.h"

namespace easyctx::ops {
namespace {

using cuda::bf16;
using cuda::check_device;
using cuda::check_float;
using cuda::check_type;
using cuda::dispatch;
using cuda::Scratch;
using cuda::typed;

cudaMemcpyKind copy_kind(const Tensor& dst, const Tensor& src) {
  const bool dd = dst.space == MemSpace::Device, sd = src.space == MemSpace::Device;
  return dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
            : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
}

// Timing events on the backend's stream, a pair per op (logging.profile), reused after collect().
class CudaOpTimer final : public OpTimer {
 public:
  explicit CudaOpTimer(cudaStream_t s) : stream_(s) {}
  ~CudaOpTimer() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  void begin() override { mark(); }
  void end() override { mark(); }
  std::vector<double> collect() override {
    std::vector<double> ms;
    if (used_ == 0) return ms;
    EASYCTX_CUDA_CHECK(cudaEventSynchronize(events_[used_ - 1]));
    for (size_t i = 0; i + 1 < used_; i += 2) {
      float t = 0;
      EASYCTX_CUDA_CHECK(cudaEventElapsedTime(&t, events_[i], events_[i + 1]));
      ms.push_back(t);
    }
    used_ = 0;
    return ms;
  }

 private:
  void mark() {
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      EASYCTX_CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    EASYCTX_CUDA_CHECK(cudaEventRecord(events_[used_++], stream_));
  }
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
};

// Events marking the copies of copy_async, reused round robin.
constexpr int64_t kCopyEvents = 16;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& o) {
    if (o.device >= 0) EASYCTX_CUDA_CHECK(cudaSetDevice(o.device));
    EASYCTX_CUDA_CHECK(cudaGetDevice(&device_));
    if (o.stream) {
      stream_ = o.stream;
    } else {
      EASYCTX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      own_stream_ = true;
    }
    // Keep freed scratch in the pool instead of returning it to the driver every call.
    EASYCTX_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, device_));
    uint64_t keep = UINT64_MAX;
    EASYCTX_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
    lt_ = std::make_unique<cuda::LtMatmul>(o.cublas_workspace);
    AttentionRouteOptions ro;
    ro.cudnn = o.cudnn_attention;
    ro.causal_graph = o.cudnn_causal_graph;
    ro.deterministic = o.deterministic;
    ro.sm90 = o.sm90_attention && kernels::sm90_device_available();
    ro.bwd_tile = o.attention_bwd_tile;
    attention_ = std::make_unique<cuda::CudaAttention>(*this, stream_, mem_, ro);
    EASYCTX_CUDA_CHECK(cudaMalloc(&flag_, sizeof(int)));
    queue_ = std::make_unique<cuda_queue::StreamQueue>(stream_);
    EASYCTX_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    EASYCTX_CUDA_CHECK(cudaEventCreateWithFlags(&queued_, cudaEventDisableTiming));
    for (cudaEvent_t& e : copied_) EASYCTX_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    // The backend's own device allocations count as live bytes too.
    own_bytes_ = cuda_own_bytes(static_cast<int64_t>(o.cublas_workspace)).total();
    mem_->add(own_bytes_);
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    if (copy_stream_) cudaStreamSynchronize(copy_stream_);
    for (cudaEvent_t e : copied_)
      if (e) cudaEventDestroy(e);
    if (queued_) cudaEventDestroy(queued_);
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
    attention_.reset();  // (subtracts the cuDNN workspace it counted)
    lt_.reset();
    cudaFree(flag_);
    mem_->sub(own_bytes_);
    if (own_stream_) cudaStreamDestroy(stream_);
  }

  cudaStream_t stream() const { return stream_; }
  std::string attention_path() const { return attention_->path(); }
  const char* name() const override { return "cuda"; }
  MemSpace memspace() const override { return MemSpace::Device; }
  std::unique_ptr<OpTimer> make_op_timer() override { return std::make_unique<CudaOpTimer>(stream_); }
  void synchronize() override { EASYCTX_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  Queue& queue() override { return *queue_; }
  void bind_thread() override { EASYCTX_CUDA_CHECK(cudaSetDevice(device_)); }
  std::unique_ptr<Queue> make_queue(bool high_priority) override {
    return std::make_unique<cuda_queue::StreamQueue>(high_priority);
  }

  MemoryStats memory_stats() const override {
    uint64_t reserved_high = 0;
    EASYCTX_CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &reserved_high));
    return {mem_->live(), mem_->peak(), static_cast<int64_t>(reserved_high)};
  }
  void reset_peak_memory() override {
    mem_->reset_peak();
    uint64_t zero = 0;  // the only value accepted: restarts the mark from what is reserved now
    EASYCTX_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero));
  }

  Buffer allocate(DType t, int64_t numel, const char*) override {
    EASYCTX_CHECK(numel >= 0, "alloc: negative element count ", numel);
    const size_t bytes = static_cast<size_t>(numel) * element_size(t);
    void* p = nullptr;
    if (bytes) {
      cudaError_t e = cudaMalloc(&p, bytes);
      EASYCTX_CHECK(e == cudaSuccess, process_label(), " alloc: cudaMalloc of ", bytes, " bytes (", numel, " x ",
                    type_name(t), ") failed: ", cudaGetErrorString(e));
      EASYCTX_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
    }
    const int64_t counted = static_cast<int64_t>(bytes);
    mem_->add(counted);
    return Buffer(p, bytes, t, MemSpace::Device, [mem = mem_, counted](void* q) {
      cudaFree(q);  // a deleter cannot throw
      mem->sub(counted);
    });
  }

  // ---------------------------------------------------------------- copies beside compute
  // Page-locked, so cudaMemcpyAsync on the copy stream really is asynchronous; freed only
  // after the device is idle (a copy into or out of it may still be queued).
  Buffer allocate_host_pinned(DType t, int64_t numel, const char*) override {
    EASYCTX_CHECK(numel >= 0, "alloc_host_pinned: negative element count ", numel);
    const size_t bytes = static_cast<size_t>(numel) * element_size(t);
    void* p = nullptr;
    if (bytes) {
      const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
      EASYCTX_CHECK(e == cudaSuccess, process_label(), " alloc_host_pinned: cudaHostAlloc of ", bytes, " bytes (",
                    numel, " x ", type_name(t), ") failed: ", cudaGetErrorString(e));
      std::memset(p, 0, bytes);
    }
    return Buffer(p, bytes, t, MemSpace::Host, [](void* q) {
      cudaDeviceSynchronize();  // a deleter cannot throw
      cudaFreeHost(q);
    });
  }

  // The copy stream first waits for the compute stream's work so far (what wrote src, what
  // still reads dst); an event on the copy stream then marks the copy's end for wait_copy.
  CopyFence copy_async(const Tensor& dst, const Tensor& src) override {
    check_same_dtype("copy_async", dst, src);
    check_numel("copy_async", "dst", dst, src.numel());
    EASYCTX_CUDA_CHECK(cudaEventRecord(queued_, stream_));
    EASYCTX_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, queued_, 0));
    if (src.numel() > 0)
      EASYCTX_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), copy_kind(dst, src), copy_stream_));
    const int64_t seq = ++copy_seq_;
    EASYCTX_CUDA_CHECK(cudaEventRecord(copied_[seq % kCopyEvents], copy_stream_));
    return {seq};
  }

  // The copy stream runs in order, so once copy f's event has been re-recorded by a later
  // copy (more than kCopyEvents copies since f), waiting on it waits for that later copy:
  // still after f, only possibly longer.
  void wait_copy(CopyFence f) override {
    EASYCTX_CHECK(f.seq >= 0 && f.seq <= copy_seq_, "wait_copy: fence ", f.seq, " was not issued by this backend");
    if (f.seq == 0) return;
    EASYCTX_CUDA_CHECK(cudaStreamWaitEvent(stream_, copied_[f.seq % kCopyEvents], 0));
  }

  void copy_on(Queue& q, const Tensor& dst, const Tensor& src) override {
    check_same_dtype("copy_on", dst, src);
    check_numel("copy_on", "dst", dst, src.numel());
    EASYCTX_CHECK(q.native() != nullptr, "copy_on: the CUDA backend copies on its own (stream) queues");
    if (src.numel() > 0)
      EASYCTX_CUDA_CHECK(
          cudaMemcpyAsync(dst.data, src.data, src.bytes(), copy_kind(dst, src), static_cast<cudaStream_t>(q.native())));
  }

  // ---------------------------------------------------------------- elementwise
  void copy(const Tensor& dst, const Tensor& src) override {
    check_numel("copy", "dst", dst, src.numel());
    const int64_t n = src.numel();
    if (n == 0) return;
    const bool dd = dst.space == MemSpace::Device, sd = src.space == MemSpace::Device;
    if (dst.dtype == src.dtype) {
      EASYCTX_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), copy_kind(dst, src), stream_));
      if (!dd) synchronize();  // the caller reads host memory next
      return;
    }
    auto convertible = [](DType t) { return t == DType::F32 || t == DType::BF16; };
    EASYCTX_CHECK(convertible(dst.dtype) && convertible(src.dtype), "copy (CUDA): conversion ", src.describe(), " -> ",
                  dst.describe(), " not supported (f32 <-> bf16)");
    if (!dd && !sd) {  // host to host: the same rounding as the CPU backend
      for (int64_t i = 0; i < n; ++i) {
        if (src.dtype == DType::F32) dst.ptr<uint16_t>()[i] = float_to_bf16(src.ptr<float>()[i]);
        else dst.ptr<float>()[i] = bf16_to_float(src.ptr<uint16_t>()[i]);
      }
      return;
    }
    // Stage the side that is on the host in device memory, convert on the device.
    Scratch stage((dd && sd) ? 0 : static_cast<size_t>(n) * element_size(dd ? src.dtype : dst.dtype), stream_, *mem_);
    const void* s = src.data;
    void* d = dst.data;
    if (!sd) {
      EASYCTX_CUDA_CHECK(cudaMemcpyAsync(stage.as<void>(), src.data, src.bytes(), cudaMemcpyHostToDevice, stream_));
      s = stage.as<void>();
    }
    if (!dd) d = stage.as<void>();
    if (dst.dtype == DType::F32) kernels::convert(static_cast<float*>(d), static_cast<const bf16*>(s), n, stream_);
    else kernels::convert(static_cast<bf16*>(d), static_cast<const float*>(s), n, stream_);
    if (!dd) {
      EASYCTX_CUDA_CHECK(cudaMemcpyAsync(dst.data, d, dst.bytes(), cudaMemcpyDeviceToHost, stream_));
      synchronize();
    }
  }

  void copy_2d(const Tensor& dst, int64_t dst_pitch, const Tensor& src, int64_t src_pitch, int64_t rows,
               int64_t width) override {
    check_copy_2d(dst, dst_pitch, src, src_pitch, rows, width);
    if (rows == 0 || width == 0) return;
    const size_t es = element_size(dst.dtype);
    EASYCTX_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, static_cast<size_t>(dst_pitch) * es, src.data,
                                         static_cast<size_t>(src_pitch) * es, static_cast<size_t>(width) * es,
                                         static_cast<size_t>(rows), copy_kind(dst, src), stream_));
    if (dst.space != MemSpace::Device) synchronize();  // the caller reads host memory next
  }

  void fill(const Tensor& x, double value) override {
    check_float("fill", x);
    dispatch(x.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      kernels::fill(typed<T>(x), static_cast<float>(value), x.numel(), stream_);
    });
  }

  void axpy(const Tensor& y, const Tensor& x, double alpha) override {
    check_float("axpy", y);
    check_device("axpy", x);
    check_numel("axpy", "x", x, y.numel());
    if (y.dtype == DType::F32 && x.dtype == DType::BF16) {  // bf16 partial into an fp32 accumulator
      kernels::axpy(y.ptr<float>(), static_cast<const bf16*>(x.data), static_cast<float>(alpha), y.numel(), stream_);
      return;
    }
    check_same_dtype("axpy", y, x);
    dispatch(y.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      kernels::axpy(typed<T>(y), typed<T>(x), static_cast<float>(alpha), y.numel(), stream_);
    });
  }

  void scale(const Tensor& x, double alpha) override {
    check_float("scale", x);
    dispatch(x.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      kernels::scale(typed<T>(x), static_cast<float>(alpha), x.numel(), stream_);
    });
  }

  double sum_squares(const Tensor& x) override {
    check_float("sum_squares", x);
    const SumSquaresScratch s = sum_squares_scratch();
    Scratch part(s.bytes, stream_, *mem_);  // f64: the blocks' partials, then the sum
    double* out = part.as<double>() + s.blocks;
    dispatch(x.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      kernels::sum_squares(typed<T>(x), x.numel(), part.as<double>(), out, stream_);
    });
    double r = 0;
    EASYCTX_CUDA_CHECK(cudaMemcpyAsync(&r, out, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    synchronize();
    return r;
  }

  // ---------------------------------------------------------------- embedding
  void embedding_fwd(const Tensor& ids, const Tensor& table, const Tensor& out) override {
    check_device("embedding_fwd", ids);
    check_float("embedding_fwd", table);
    check_device("embedding_fwd", out);
    const EmbeddingDims e = check_embedding("embedding_fwd", ids, table, out);
    EASYCTX_CUDA_CHECK(cudaMemsetAsync(flag_, 0, sizeof(int), stream_));
    dispatch(table.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      kernels::embedding_fwd(ids.ptr<int32_t>(), e.n, typed<T>(table), e.vocab, e.d, typed<T>(out), flag_, stream_);
    });
    EASYCTX_CHECK(!read_flag(), "embedding_fwd: a token id is outside the vocabulary [0, ", e.vocab, ")");
  }

  void embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dtable) override {
    check_device("embedding_bwd", ids);
    check_float("embedding_bwd", dtable);
    check_device("embedding_bwd", dout);
    const EmbeddingDims e = check_embedding("embedding_bwd", ids, dtable, dout);
    const int64_t d = e.d, vocab = e.vocab, n = e.n;
    if (n == 0) return;
    size_t temp_bytes = 0;
    kernels::sort_ids(ids.ptr<int32_t>(), nullptr, nullptr, nullptr, n, nullptr, &temp_bytes, 32, stream_);
    Scratch idx(embedding_bwd_scratch(n).ids, stream_, *mem_);
    Scratch temp(temp_bytes, stream_, *mem_);
    int32_t* sorted = idx.as<int32_t>();
    int32_t* iota = sorted + n;
    int32_t* order = iota + n;
    kernels::sort_ids(ids.ptr<int32_t>(), sorted, iota, order, n, temp.as<void>(), &temp_bytes, 32, stream_);
    dispatch(dtable.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      kernels::embedding_bwd_sorted(sorted, order, n, typed<T>(dout), vocab, d, typed<T>(dtable), stream_);
    });
  }

  // ---------------------------------------------------------------- RMSNorm
  void rmsnorm_fwd(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd) override {
    check_float("rmsnorm_fwd", x);
    for (const Tensor* t : {&w, &y}) {
      check_device("rmsnorm_fwd", *t);
      check_same_dtype("rmsnorm_fwd", x, *t);
    }
    check_type("rmsnorm_fwd", "rstd", rstd, DType::F32);
    const RowDims rows = check_rmsnorm("rmsnorm_fwd", x, w, rstd, {&y});
    const int64_t n = rows.n, d = rows.d;
    dispatch(x.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      kernels::rmsnorm_fwd(typed<T>(x), typed<T>(w), n, d, static_cast<float>(eps), typed<T>(y), rstd.ptr<float>(),
                           stream_);
    });
  }

  void rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                   const Tensor& dw) override {
    check_float("rmsnorm_bwd", x);
    for (const Tensor* t : {&w, &dy, &dx}) {
      check_device("rmsnorm_bwd", *t);
      check_same_dtype("rmsnorm_bwd", x, *t);
    }
    check_type("rmsnorm_bwd", "rstd", rstd, DType::F32);
    const RowDims rows = check_rmsnorm("rmsnorm_bwd", x, w, rstd, {&dy, &dx});
    const int64_t n = rows.n, d = rows.d;
    if (!dw.empty()) {
      check_float("rmsnorm_bwd", dw);  // f32 or bf16, whatever x is
      check_numel("rmsnorm_bwd", "dw", dw, d);
    }
    const RmsnormBwdScratch s = rmsnorm_bwd_scratch(n, d, !dw.empty());
    const int64_t chunks = s.chunks;
    Scratch part(s.dw_partials, stream_, *mem_);
    dispatch(x.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      kernels::rmsnorm_bwd(typed<T>(x), typed<T>(w), rstd.ptr<float>(), typed<T>(dy), n, d, typed<T>(dx),
                           part.as<float>(), stream_);
    });
    if (dw.empty() || n == 0) return;
    dispatch(dw.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      kernels::reduce_columns_add(part.as<float>(), chunks, d, typed<T>(dw), stream_);
    });
  }

  // ---------------------------------------------------------------- matmul
  void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, double alpha,
              double beta) override {
    check_float("matmul", a);
    check_device("matmul", b);
    check_float("matmul", c);
    check_same_dtype("matmul", a, b);
    EASYCTX_CHECK(c.dtype == a.dtype || (a.dtype == DType::BF16 && c.dtype == DType::F32),
                  "matmul (CUDA): C must have A's dtype or be f32 for bf16 inputs, got ", a.describe(), " ",
                  c.describe());
    const int64_t k = check_matmul(a, trans_a, b, trans_b, c).k;
    if (k == 0) {  // C = beta C
      if (beta == 0) fill(c, 0.0);
      else if (beta != 1) scale(c, beta);
      return;
    }
    lt_->run(a, trans_a, b, trans_b, c, static_cast<float>(alpha), static_cast<float>(beta), stream_);
  }

  // ---------------------------------------------------------------- RoPE
  void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, bool inverse) override {
    check_float("rope", x);
    check_device("rope", positions);
    check_device("rope", inv_freq);
    const RopeDims r = check_rope(x, positions, inv_freq);
    dispatch(x.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      kernels::rope(typed<T>(x), r.n, r.heads, r.head_dim, positions.ptr<int32_t>(), inv_freq.ptr<float>(), inverse,
                    stream_);
    });
  }

  // ---------------------------------------------------------------- attention (cuda_attention.cpp)
  void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionBlock& blk, const Tensor& o,
                     const Tensor& lse) override {
    attention_->forward(q, k, v, blk, o, lse);
  }
  void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                     const Tensor& dout, const AttentionBlock& blk, const Tensor& dq, const Tensor& dk,
                     const Tensor& dv) override {
    attention_->backward(q, k, v, o, lse, dout, blk, dq, dk, dv);
  }
  std::string attention_route(const AttentionCall& c, bool backward) const override {
    return attention_->route(c, backward);
  }

  void attention_merge(const Tensor& o, const Tensor& lse, const Tensor& o_blk, const Tensor& lse_blk) override {
    check_float("attention_merge", o);
    check_device("attention_merge", o_blk);
    // A ring keeps its running output in fp32 while each block arrives in the data type.
    const bool mixed = o.dtype == DType::F32 && o_blk.dtype == DType::BF16;
    if (!mixed) check_same_dtype("attention_merge", o, o_blk);
    check_type("attention_merge", "lse", lse, DType::F32);
    check_type("attention_merge", "lse_blk", lse_blk, DType::F32);
    EASYCTX_CHECK(o.ndim == 4 && o.shape == o_blk.shape, "attention_merge: o ", o.describe(), " vs o_blk ",
                  o_blk.describe());
    const int64_t b = o.dim(0), sq = o.dim(1), hq = o.dim(2), hd = o.dim(3);
    check_numel("attention_merge", "lse", lse, b * hq * sq);
    check_numel("attention_merge", "lse_blk", lse_blk, b * hq * sq);
    if (mixed) {
      kernels::attention_merge(o.ptr<float>(), lse.ptr<float>(), static_cast<const bf16*>(o_blk.data),
                               lse_blk.ptr<float>(), b, sq, hq, hd, stream_);
      return;
    }
    dispatch(o.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      kernels::attention_merge(typed<T>(o), lse.ptr<float>(), typed<T>(o_blk), lse_blk.ptr<float>(), b, sq, hq, hd,
                               stream_);
    });
  }

  // ---------------------------------------------------------------- SwiGLU
  void swiglu_fwd(const Tensor& g, const Tensor& u, const Tensor& h) override {
    check_float("swiglu_fwd", g);
    for (const Tensor* t : {&u, &h}) {
      check_device("swiglu_fwd", *t);
      check_same_dtype("swiglu_fwd", g, *t);
      check_numel("swiglu_fwd", "u/h", *t, g.numel());
    }
    dispatch(g.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      kernels::swiglu_fwd(typed<T>(g), typed<T>(u), g.numel(), typed<T>(h), stream_);
    });
  }

  void swiglu_bwd(const Tensor& g, const Tensor& u, const Tensor& dh, const Tensor& dg, const Tensor& du) override {
    check_float("swiglu_bwd", g);
    for (const Tensor* t : {&u, &dh, &dg, &du}) {
      check_device("swiglu_bwd", *t);
      check_same_dtype("swiglu_bwd", g, *t);
      check_numel("swiglu_bwd", "u/dh/dg/du", *t, g.numel());
    }
    dispatch(g.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      kernels::swiglu_bwd(typed<T>(g), typed<T>(u), typed<T>(dh), g.numel(), typed<T>(dg), typed<T>(du), stream_);
    });
  }

  // ---------------------------------------------------------------- LM head + cross entropy
  LossSums lm_head_loss(const Tensor& x, const Tensor& w, const Tensor& labels, int64_t tile_tokens, double grad_scale,
                        const Tensor& dx, const Tensor& dw) override {
    check_float("lm_head_loss", x);
    check_device("lm_head_loss", w);
    check_same_dtype("lm_head_loss", x, w);
    check_type("lm_head_loss", "labels", labels, DType::I32);
    const int64_t d = w.dim(-1), vocab = w.numel() / d, n = labels.numel();
    check_numel("lm_head_loss", "x", x, n * d);
    if (!dx.empty()) {
      check_device("lm_head_loss", dx);
      check_same_dtype("lm_head_loss", x, dx);
      check_numel("lm_head_loss", "dx", dx, n * d);
    }
    if (!dw.empty()) {
      check_float("lm_head_loss", dw);
      EASYCTX_CHECK(dw.dtype == x.dtype || dw.dtype == DType::F32, "lm_head_loss: dw must be ", type_name(x.dtype),
                    " or f32, got ", dw.describe());
      check_numel("lm_head_loss", "dw", dw, vocab * d);
    }
    LossSums out;
    if (n == 0) return out;
    // The logits tile: at most 64M fp32 elements (256 MiB) whatever the caller asks.
    const bool bwd = !dx.empty();
    const bool bf = x.dtype == DType::BF16;
    const LmHeadScratch s = cuda_lm_head_scratch(n, vocab, tile_tokens, bwd, bf);
    const int64_t tile = s.tile_rows;
    Scratch logits(s.logits, stream_, *mem_);  // f32[tile, V]
    Scratch grad(s.grad, stream_, *mem_);      // bf16[tile, V]
    Scratch sums(s.nll, stream_, *mem_);       // nll f64[n], sum, count
    double* nll = sums.as<double>();
    EASYCTX_CUDA_CHECK(cudaMemsetAsync(flag_, 0, sizeof(int), stream_));
    const Tensor w2 = w.reshape({vocab, d});
    for (int64_t t0 = 0; t0 < n; t0 += tile) {
      const int64_t tl = std::min(tile, n - t0);
      const Tensor xt(static_cast<char*>(x.data) + t0 * d * element_size(x.dtype), x.dtype, {tl, d}, MemSpace::Device);
      const Tensor lt(logits.as<float>(), DType::F32, {tl, vocab}, MemSpace::Device);
      matmul(xt, false, w2, true, lt, 1.0, 0.0);  // logits = x w^T, fp32 out
      const int32_t* lab = labels.ptr<int32_t>() + t0;
      Tensor gt;
      if (bf) {
        gt = Tensor(grad.as<bf16>(), DType::BF16, {tl, vocab}, MemSpace::Device);
        kernels::cross_entropy_tile(logits.as<float>(), lab, tl, vocab, static_cast<float>(grad_scale), nll + t0,
                                    bwd ? grad.as<bf16>() : nullptr, flag_, stream_);
      } else {
        gt = lt;  // fp32: the gradient overwrites the logits in place
        kernels::cross_entropy_tile(logits.as<float>(), lab, tl, vocab, static_cast<float>(grad_scale), nll + t0,
                                    bwd ? logits.as<float>() : nullptr, flag_, stream_);
      }
      if (!bwd) continue;
      const Tensor dxt(static_cast<char*>(dx.data) + t0 * d * element_size(dx.dtype), dx.dtype, {tl, d},
                       MemSpace::Device);
      matmul(gt, false, w2, false, dxt, 1.0, 0.0);                                     // dx = G w
      if (!dw.empty()) matmul(gt, true, xt, false, dw.reshape({vocab, d}), 1.0, 1.0);  // dw += G^T x
    }
    kernels::sum_f64(nll, n, nll + n, stream_);
    kernels::count_labels(labels.ptr<int32_t>(), n, reinterpret_cast<int64_t*>(nll + n + 1), stream_);
    double host[2];
    EASYCTX_CUDA_CHECK(cudaMemcpyAsync(host, nll + n, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream_));
    const bool bad = read_flag();  // synchronises
    EASYCTX_CHECK(!bad, "lm_head_loss: a label is outside [-1, ", vocab, ")");
    out.sum_nll = host[0];
    std::memcpy(&out.count, &host[1], sizeof(int64_t));
    return out;
  }

  // ---------------------------------------------------------------- LM-head scoring (evaluations)
  void lm_head_score(const Tensor& x, const Tensor& w, const Tensor& labels, int64_t tile_tokens, const Tensor& nll,
                     const Tensor& top) override {
    check_float("lm_head_score", x);
    check_device("lm_head_score", w);
    const EmbeddingDims dims = check_lm_head_score(x, w, labels, nll, top);
    const int64_t n = dims.n, vocab = dims.vocab, d = dims.d;
    if (n == 0) return;
    const LmHeadScratch s = cuda_lm_head_score_scratch(n, vocab, tile_tokens);
    const int64_t tile = s.tile_rows;
    Scratch logits(s.logits, stream_, *mem_);     // f32[tile, V]
    Scratch rows(s.nll + s.top, stream_, *mem_);  // nll f64[n], then top i32[n]
    double* dnll = rows.as<double>();
    int32_t* dtop = reinterpret_cast<int32_t*>(dnll + n);
    EASYCTX_CUDA_CHECK(cudaMemsetAsync(flag_, 0, sizeof(int), stream_));
    for (int64_t t0 = 0; t0 < n; t0 += tile) {
      const int64_t tl = std::min(tile, n - t0);
      const Tensor xt(static_cast<char*>(x.data) + t0 * d * element_size(x.dtype), x.dtype, {tl, d}, MemSpace::Device);
      const Tensor lt(logits.as<float>(), DType::F32, {tl, vocab}, MemSpace::Device);
      matmul(xt, false, w, true, lt, 1.0, 0.0);  // logits = x w^T, fp32 out (as lm_head_loss)
      kernels::score_tile(logits.as<float>(), labels.ptr<int32_t>() + t0, tl, vocab, dnll + t0, dtop + t0, flag_,
                          stream_);
    }
    EASYCTX_CUDA_CHECK(cudaMemcpyAsync(nll.data, dnll, static_cast<size_t>(n) * 8, cudaMemcpyDeviceToHost, stream_));
    EASYCTX_CUDA_CHECK(cudaMemcpyAsync(top.data, dtop, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToHost, stream_));
    const bool bad = read_flag();  // synchronises: the host arrays are written
    EASYCTX_CHECK(!bad, "lm_head_score: a label is outside [-1, ", vocab, ")");
  }

  // ---------------------------------------------------------------- AdamW
  void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWStep& s) override {
    for (const Tensor* t : {&param, &grad, &m, &v}) {
      check_type("adamw", "param/grad/m/v", *t, DType::F32);
      check_numel("adamw", "grad/m/v", *t, param.numel());
    }
    kernels::adamw(param.ptr<float>(), grad.ptr<float>(), m.ptr<float>(), v.ptr<float>(), param.numel(),
                   kernels::adamw_consts(s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.step), stream_);
  }

 private:
  // Reads the device error flag (synchronises the stream).
  bool read_flag() {
    int h = 0;
    EASYCTX_CUDA_CHECK(cudaMemcpyAsync(&h, flag_, sizeof(int), cudaMemcpyDeviceToHost, stream_));
    synchronize();
    return h != 0;
  }

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  bool own_stream_ = false;
  std::unique_ptr<cuda::LtMatmul> lt_;
  int* flag_ = nullptr;                             // device int: set by kernels that find bad ids/labels
  std::unique_ptr<cuda::CudaAttention> attention_;  // attention_fwd/bwd (cuda_attention.cpp)
  std::shared_ptr<MemoryCounter> mem_ = std::make_shared<MemoryCounter>();
  cudaMemPool_t pool_ = nullptr;                    // the device's default pool: stream-ordered scratch
  int64_t own_bytes_ = 0;                           // cuBLASLt workspace + error flag
  std::unique_ptr<cuda_queue::StreamQueue> queue_;  // the compute stream as a Queue
  cudaStream_t copy_stream_ = nullptr;              // copy_async: copies beside the compute stream
  cudaEvent_t queued_ = nullptr;                    // the compute stream's work before a copy
  cudaEvent_t copied_[kCopyEvents] = {};            // copy k's end: copied_[k % kCopyEvents]
  int64_t copy_seq_ = 0;                            // copies issued
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& opts) {
  return std::make_unique<CudaBackend>(opts);
}

cudaStream_t cuda_stream(Backend& b) {
  auto* c = dynamic_cast<CudaBackend*>(&b.base());
  EASYCTX_CHECK(c != nullptr, "cuda_stream: backend '", b.name(), "' is not the CUDA backend");
  return c->stream();
}

std::string cuda_attention_path(Backend& b) {
  auto* c = dynamic_cast<CudaBackend*>(&b.base());
  EASYCTX_CHECK(c != nullptr, "cuda_attention_path: backend '", b.name(), "' is not the CUDA backend");
  return c->attention_path();
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

}  // namespace easyctx::ops
