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
#include "kernels/attention.h"
#include "kernels/cuda_check.h"
#include "kernels/kernels.h"
#include "ops/cuda/cudnn_attention.h"
#include "ops/cuda/lt_matmul.h"
#include "ops/half.h"
#include "ops/memory_counter.h"
#include "ops/scratch.h"

namespace easyctx::ops {
namespace {

using kernels::bf16;

// Stream-ordered scratch buffer (RAII): freed on the stream when it goes out of scope.
// Counted in the backend's live bytes while it exists, so the peak covers Buffers and
// scratch together (the same stream reuses the memory only after the free, in order).
// Sized by the scratch functions of ops/scratch.h and ops/attention_route.h.
class Scratch {
 public:
  Scratch(size_t bytes, cudaStream_t st, MemoryCounter& mem) : st_(st), mem_(mem) {
    if (!bytes) return;
    EASYCTX_CUDA_CHECK(cudaMallocAsync(&p_, bytes, st));
    bytes_ = static_cast<int64_t>(bytes);
    mem_.add(bytes_);
  }
  Scratch(int64_t bytes, cudaStream_t st, MemoryCounter& mem) : Scratch(static_cast<size_t>(bytes), st, mem) {}
  ~Scratch() {
    if (!p_) return;
    cudaFreeAsync(p_, st_);  // a destructor cannot throw; a failed free leaks the block
    mem_.sub(bytes_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
  int64_t bytes_ = 0;
  cudaStream_t st_;
  MemoryCounter& mem_;
};

void check_device(const char* op, const Tensor& t) {
  EASYCTX_CHECK(t.space == MemSpace::Device, op, ": the CUDA backend needs device memory, got a host tensor ",
                t.describe());
}
void check_float(const char* op, const Tensor& t) {
  check_device(op, t);
  EASYCTX_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, op, ": the CUDA backend stores f32 or bf16, got ",
                t.describe());
}
void check_type(const char* op, const char* name, const Tensor& t, DType want) {
  check_device(op, t);
  EASYCTX_CHECK(t.dtype == want, op, ": ", name, " must be ", type_name(want), ", got ", t.describe());
}

// Calls f with a typed null pointer (float* or bf16*) chosen by the dtype.
template <typename F>
void dispatch(DType t, F&& f) {
  if (t == DType::F32) f(static_cast<float*>(nullptr));
  else f(static_cast<bf16*>(nullptr));
}
template <typename T>
T* typed(const Tensor& t) { return static_cast<T*>(t.data); }

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
    use_cudnn_ = o.cudnn_attention;
    causal_graph_ = o.cudnn_causal_graph;
    EASYCTX_CHECK(o.attention_bwd_tile == 0 || (o.attention_bwd_tile >= 128 && o.attention_bwd_tile % 128 == 0),
                  "CudaBackendOptions::attention_bwd_tile must be 0 or a positive multiple of 128, got ",
                  o.attention_bwd_tile);
    bwd_tile_ = o.attention_bwd_tile;
    det_ = o.deterministic;
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
    cudnn_.reset();
    lt_.reset();
    cudaFree(flag_);
    mem_->sub(own_bytes_ + cudnn_ws_counted_);
    if (own_stream_) cudaStreamDestroy(stream_);
  }

  cudaStream_t stream() const { return stream_; }
  std::string attention_path() const {
    return last_path_ + (cudnn_decline_.empty() ? "" : " (cuDNN declined: " + cudnn_decline_ + ")");
  }
  const char* name() const override { return "cuda"; }
  MemSpace memspace() const override { return MemSpace::Device; }
  std::unique_ptr<OpTimer> make_op_timer() override { return std::make_unique<CudaOpTimer>(stream_); }
  void synchronize() override { EASYCTX_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  Queue& queue() override { return *queue_; }
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
      EASYCTX_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), copy_kind(dst, src),
                                         static_cast<cudaStream_t>(q.native())));
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
    EASYCTX_CHECK(convertible(dst.dtype) && convertible(src.dtype), "copy (CUDA): conversion ", src.describe(),
                  " -> ", dst.describe(), " not supported (f32 <-> bf16)");
    if (!dd && !sd) {  // host to host: the same rounding as the CPU backend
      for (int64_t i = 0; i < n; ++i) {
        if (src.dtype == DType::F32) dst.ptr<uint16_t>()[i] = float_to_bf16(src.ptr<float>()[i]);
        else dst.ptr<float>()[i] = bf16_to_float(src.ptr<uint16_t>()[i]);
      }
      return;
    }
    // Stage the side that is on the host in device memory, convert on the device.
    Scratch stage((dd && sd) ? 0 : static_cast<size_t>(n) * element_size(dd ? src.dtype : dst.dtype), stream_,
                  *mem_);
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
    check_type("embedding_fwd", "ids", ids, DType::I32);
    check_float("embedding_fwd", table);
    check_device("embedding_fwd", out);
    check_same_dtype("embedding_fwd", table, out);
    const int64_t d = table.dim(-1), vocab = table.numel() / d, n = ids.numel();
    check_numel("embedding_fwd", "out", out, n * d);
    EASYCTX_CUDA_CHECK(cudaMemsetAsync(flag_, 0, sizeof(int), stream_));
    dispatch(table.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      kernels::embedding_fwd(ids.ptr<int32_t>(), n, typed<T>(table), vocab, d, typed<T>(out), flag_, stream_);
    });
    EASYCTX_CHECK(!read_flag(), "embedding_fwd: a token id is outside the vocabulary [0, ", vocab, ")");
  }

  void embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dtable) override {
    check_type("embedding_bwd", "ids", ids, DType::I32);
    check_float("embedding_bwd", dtable);
    check_device("embedding_bwd", dout);
    check_same_dtype("embedding_bwd", dtable, dout);
    const int64_t d = dtable.dim(-1), vocab = dtable.numel() / d, n = ids.numel();
    check_numel("embedding_bwd", "dout", dout, n * d);
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
    const int64_t d = w.numel(), n = x.numel() / d;
    check_numel("rmsnorm_fwd", "x", x, n * d);
    check_numel("rmsnorm_fwd", "y", y, n * d);
    check_numel("rmsnorm_fwd", "rstd", rstd, n);
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
    const int64_t d = w.numel(), n = x.numel() / d;
    check_numel("rmsnorm_bwd", "dy", dy, n * d);
    check_numel("rmsnorm_bwd", "dx", dx, n * d);
    check_numel("rmsnorm_bwd", "rstd", rstd, n);
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
    EASYCTX_CHECK(a.ndim == 2 && b.ndim == 2 && c.ndim == 2, "matmul: 2-D views expected, got ", a.describe(), " ",
                  b.describe(), " ", c.describe());
    const int64_t m = trans_a ? a.dim(1) : a.dim(0), k = trans_a ? a.dim(0) : a.dim(1);
    const int64_t kb = trans_b ? b.dim(1) : b.dim(0), n = trans_b ? b.dim(0) : b.dim(1);
    EASYCTX_CHECK(k == kb && c.dim(0) == m && c.dim(1) == n, "matmul: shapes do not agree: op(A) ", m, "x", k,
                  ", op(B) ", kb, "x", n, ", C ", c.describe());
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
    check_type("rope", "positions", positions, DType::I32);
    check_type("rope", "inv_freq", inv_freq, DType::F32);
    EASYCTX_CHECK(x.ndim == 3, "rope: x must be [n, heads, head_dim], got ", x.describe());
    const int64_t n = x.dim(0), h = x.dim(1), hd = x.dim(2);
    EASYCTX_CHECK(hd % 2 == 0, "rope: odd head_dim ", hd);
    check_numel("rope", "positions", positions, n);
    check_numel("rope", "inv_freq", inv_freq, hd / 2);
    dispatch(x.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      kernels::rope(typed<T>(x), n, h, hd, positions.ptr<int32_t>(), inv_freq.ptr<float>(), inverse, stream_);
    });
  }

  // ---------------------------------------------------------------- attention
  static kernels::AttentionParams attn_params(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                              const AttentionBlock& blk) {
    for (const Tensor* t : {&q, &k, &v}) check_type(op, "q/k/v", *t, DType::BF16);
    EASYCTX_CHECK(q.ndim == 4 && k.ndim == 4 && v.ndim == 4, op, ": q, k, v must be [B, S, H, hd], got ",
                  q.describe(), " ", k.describe(), " ", v.describe());
    kernels::AttentionParams p;
    p.batch = q.dim(0);
    p.sq = q.dim(1);
    p.hq = q.dim(2);
    p.hd = q.dim(3);
    p.sk = k.dim(1);
    p.hkv = k.dim(2);
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
    return p;
  }

  void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionBlock& blk, const Tensor& o,
                     const Tensor& lse) override {
    kernels::AttentionParams p = attn_params("attention_fwd", q, k, v, blk);
    check_type("attention_fwd", "o", o, DType::BF16);
    check_type("attention_fwd", "lse", lse, DType::F32);
    check_numel("attention_fwd", "o", o, q.numel());
    check_numel("attention_fwd", "lse", lse, p.batch * p.hq * p.sq);
    p.o_out = static_cast<bf16*>(o.data);
    p.lse_out = lse.ptr<float>();
    if (p.sk == 0) {  // no keys at all: every row is empty
      fill(o, 0.0);
      fill(lse, -INFINITY);
      return;
    }
    if (causal_square_cudnn(p)) return;
    if (causal_in_chunks(p)) return;
    if (cudnn_eligible(p, {q.data, k.data, v.data, o.data, lse.data}) &&
        after_cudnn(
            cudnn()->try_fwd(shape_of(p), p.scale, q.data, k.data, v.data, o.data, lse.ptr<float>(), stream_))) {
      last_path_ = "cudnn";
      return;
    }
    note_decline();
    kernels::attention_fwd(p, stream_);
    last_path_ = "kernel";
  }

  void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                     const Tensor& dout, const AttentionBlock& blk, const Tensor& dq, const Tensor& dk,
                     const Tensor& dv) override {
    kernels::AttentionParams p = attn_params("attention_bwd", q, k, v, blk);
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
    if (!blk.accumulate && !f32_grads && p.sk > 0 && p.sq > 0 && cudnn_bwd_in_place(p, dq, dk, dv)) return;
    if (!blk.accumulate)
      for (const Tensor* t : {&dq, &dk, &dv}) fill(*t, 0.0);
    if (p.sk == 0 || p.sq == 0) return;
    if (cudnn_bwd(p, dq, dk, dv)) return;
    note_decline();
    // fp32 gradients (a ring's accumulators): this block's bf16 contribution is computed into
    // zeroed scratch, then added in fp32, so rounding does not compound across ring steps.
    Scratch g(f32_grads ? static_cast<size_t>(q.numel() + 2 * k.numel()) * sizeof(bf16) : 0, stream_, *mem_);
    if (f32_grads)
      EASYCTX_CUDA_CHECK(cudaMemsetAsync(g.as<bf16>(), 0, static_cast<size_t>(q.numel() + 2 * k.numel()) * sizeof(bf16),
                                         stream_));
    Scratch delta(static_cast<size_t>(p.batch * p.hq * p.sq) * sizeof(float), stream_, *mem_);
    p.dq = f32_grads ? g.as<bf16>() : static_cast<bf16*>(dq.data);
    p.dk = f32_grads ? p.dq + q.numel() : static_cast<bf16*>(dk.data);
    p.dv = f32_grads ? p.dk + k.numel() : static_cast<bf16*>(dv.data);
    p.delta = delta.as<float>();
    kernels::attention_bwd(p, stream_);
    if (f32_grads) {
      add_into(dq, 0, p.dq, q.numel());
      add_into(dk, 0, p.dk, k.numel());
      add_into(dv, 0, p.dv, k.numel());
    }
    last_path_ = "kernel";
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
  LossSums lm_head_loss(const Tensor& x, const Tensor& w, const Tensor& labels, int64_t tile_tokens,
                        double grad_scale, const Tensor& dx, const Tensor& dw) override {
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
      matmul(gt, false, w2, false, dxt, 1.0, 0.0);                       // dx = G w
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
  // dst[offset .. offset + n) += x (bf16 or f32), dst bf16 or f32 (rounded once, from fp32).
  template <typename TX>
  void add_into(const Tensor& dst, int64_t offset, const TX* x, int64_t n) {
    if (dst.dtype == DType::F32) kernels::axpy(dst.ptr<float>() + offset, x, 1.f, n, stream_);
    else kernels::axpy(static_cast<bf16*>(dst.data) + offset, x, 1.f, n, stream_);
  }

  // The backward of one block through cuDNN's fused (composite) backward graph; false, with
  // nothing written, where it does not apply (cuDNN off or declining, unaligned buffers, a
  // causal block that is neither a square nor fully visible). A block of at most T x T
  // (T = the backward tile) is one call into bf16 scratch that is added into the gradients.
  // A larger one (one GPU's causal sequence, a ring's blocks) runs per sequence of the batch
  // in T x T tiles, key tile by key tile (a causal square: only tiles on or below the
  // diagonal, the diagonal ones causal): tile j's dK/dV sum every query tile's contribution
  // in fp32 and are added once; dQ sums in an fp32 accumulator over the block (the gradient
  // itself when it is fp32, a ring's accumulator), so no gradient is rounded more than once
  // per call and the scratch stays bounded by the tile.
  bool cudnn_bwd(const kernels::AttentionParams& p, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
    if (!use_cudnn_) return false;
    const bool full = unmasked(p);
    if (!full && !causal_square(p)) return false;
    if (!aligned16({p.q, p.k, p.v, p.o, p.dout, p.lse})) return false;
    if (!cudnn()) return false;
    const int64_t T = attention_bwd_tile(det_, bwd_tile_), H = p.hq, Hk = p.hkv, hd = p.hd;
    const int64_t qrow = H * hd, krow = Hk * hd, qn = p.batch * p.sq * qrow, kn = p.batch * p.sk * krow;
    if (p.sq <= T && p.sk <= T) {  // one call
      const cuda::SdpaShape shape{p.batch, p.sq, p.sk, H, Hk, hd, !full, 0, det_};
      if (!cudnn()->has_bwd_plan(shape)) return false;
      Scratch g(static_cast<size_t>(qn + 2 * kn) * sizeof(bf16), stream_, *mem_);
      bf16* gq = g.as<bf16>();
      if (!after_cudnn(cudnn()->try_bwd(shape, p.scale, p.q, p.k, p.v, p.o, p.lse, p.dout, gq, gq + qn, gq + qn + kn,
                                        stream_)))
        return false;
      add_into(dq, 0, gq, qn);
      add_into(dk, 0, gq + qn, kn);
      add_into(dv, 0, gq + qn + kn, kn);
      last_path_ = std::string("cudnn") + (det_ ? "" : " (atomic dQ)");
      return true;
    }
    // Tiles: every shape is planned before anything is written.
    const int64_t S = p.sq, Sk = p.sk, nq = (S + T - 1) / T, nk = (Sk + T - 1) / T;
    const int64_t lastq = S - (nq - 1) * T, lastk = Sk - (nk - 1) * T;
    auto shape = [&](int64_t rows, int64_t cols, bool causal) {
      return cuda::SdpaShape{1, rows, cols, H, Hk, hd, causal, S, det_};
    };
    std::vector<cuda::SdpaShape> need;
    if (full) {
      for (int64_t r : {T, lastq})
        for (int64_t c : {T, lastk}) need.push_back(shape(r, c, false));
    } else {
      need = {shape(T, T, true), shape(T, T, false), shape(lastq, T, false), shape(lastq, lastq, true)};
    }
    for (const auto& sh : need)
      if (!cudnn()->has_bwd_plan(sh)) return false;
    Scratch g(static_cast<size_t>(T * (qrow + 2 * krow)) * sizeof(bf16), stream_, *mem_);
    bf16 *gq = g.as<bf16>(), *gk = gq + T * qrow, *gv = gk + T * krow;
    const bool dq_f32 = dq.dtype == DType::F32;
    Scratch dq_acc(dq_f32 ? 0 : static_cast<size_t>(S * qrow) * sizeof(float), stream_, *mem_);
    Scratch kv_acc(static_cast<size_t>(2 * T * krow) * sizeof(float), stream_, *mem_);
    float *dka = kv_acc.as<float>(), *dva = dka + T * krow;
    for (int64_t bi = 0; bi < p.batch; ++bi) {
      const bf16 *q = p.q + bi * S * qrow, *k = p.k + bi * Sk * krow, *v = p.v + bi * Sk * krow;
      const bf16 *o = p.o + bi * S * qrow, *dout = p.dout + bi * S * qrow;
      const float* lse = p.lse + bi * H * S;
      float* dqa = dq_f32 ? dq.ptr<float>() + bi * S * qrow : dq_acc.as<float>();
      if (!dq_f32) EASYCTX_CUDA_CHECK(cudaMemsetAsync(dqa, 0, static_cast<size_t>(S * qrow) * sizeof(float), stream_));
      for (int64_t j = 0; j < nk; ++j) {
        const int64_t k0 = j * T, cols = std::min(T, Sk - k0);
        EASYCTX_CUDA_CHECK(cudaMemsetAsync(dka, 0, static_cast<size_t>(2 * T * krow) * sizeof(float), stream_));
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
                 (det_ ? "" : ", atomic dQ") + ")";
    return true;
  }

  // attention_bwd that overwrites bf16 gradients (blk.accumulate false: one block covers the
  // keys, LocalAttention): one call of cuDNN's composite backward writing dq/dk/dv in place,
  // no scratch and no tiles. Atomic dQ: any length (cuDNN's workspace holds the f32 dQ
  // accumulator of the block, as the tiled path's own accumulator would); deterministic: up
  // to a T x T block (its dP lives in the workspace). false: nothing written (the caller
  // zeroes the gradients and takes the accumulating path).
  bool cudnn_bwd_in_place(const kernels::AttentionParams& p, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
    if (!use_cudnn_) return false;
    const bool full = unmasked(p);
    if (!full && !causal_square(p)) return false;
    const int64_t T = attention_bwd_tile(det_, bwd_tile_);
    if (det_ && (p.sq > T || p.sk > T)) return false;
    if (!aligned16({p.q, p.k, p.v, p.o, p.dout, p.lse, dq.data, dk.data, dv.data})) return false;
    if (!cudnn()) return false;
    const cuda::SdpaShape shape{p.batch, p.sq, p.sk, p.hq, p.hkv, p.hd, !full, 0, det_};
    if (!cudnn()->has_bwd_plan(shape)) return false;
    if (!after_cudnn(cudnn()->try_bwd(shape, p.scale, p.q, p.k, p.v, p.o, p.lse, p.dout, dq.data, dk.data, dv.data,
                                      stream_)))
      return false;
    last_path_ = std::string("cudnn (one call, in place") + (det_ ? "" : ", atomic dQ") + ")";
    return true;
  }

  // A whole causal square (q and k at the same positions) in one call of cuDNN's composite
  // causal forward graph; false (nothing written) when cuDNN is off or has no plan.
  bool causal_square_cudnn(const kernels::AttentionParams& p) {
    if (!causal_square(p) || !use_cudnn_ || !causal_graph_) return false;
    if (!aligned16({p.q, p.k, p.v, p.o_out, p.lse_out})) return false;
    cuda::SdpaShape sh = shape_of(p);
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
  // Returns false (nothing written) where it does not apply: batch > 1, short sequences,
  // cuDNN off or declining the shape.
  bool causal_in_chunks(const kernels::AttentionParams& p) {
    if (!causal_square(p) || p.batch != 1 || !use_cudnn_) return false;
    const int64_t S = p.sq, t = causal_chunk_rows(S), H = p.hq, hd = p.hd;
    if (S < 2 * t) return false;
    if (!aligned16({p.q, p.k, p.v, p.o_out})) return false;
    if (!cudnn() || !cudnn()->has_fwd_plan({1, t, t, p.hq, p.hkv, p.hd})) return false;
    Scratch acc_o(static_cast<size_t>(t * H * hd) * sizeof(float), stream_, *mem_);  // f32 [t, H, hd]
    Scratch acc_l(static_cast<size_t>(H * t) * sizeof(float), stream_, *mem_);       // f32 [H, t]
    Scratch blk_o(static_cast<size_t>(t * H * hd) * sizeof(bf16), stream_, *mem_);   // bf16 [t, H, hd]
    Scratch blk_l(static_cast<size_t>(H * t) * sizeof(float), stream_, *mem_);       // f32 [H, t]
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
        copy(ao, bo);  // the diagonal part, widened to the fp32 accumulator
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
        attention_merge(ao, al, bo, bl);
        copy(Tensor(p.o_out + r0 * p.q_row, DType::BF16, {1, rows, H, hd}, MemSpace::Device), ao);
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

  // A block every query of which sees every key (not causal, or the diagonal past the last key).
  static bool unmasked(const kernels::AttentionParams& p) { return !p.causal || p.diag >= p.sk - 1; }
  // A whole causal square: queries and keys at the same positions (top-left mask).
  static bool causal_square(const kernels::AttentionParams& p) {
    return p.causal && p.diag == 0 && p.sq == p.sk;
  }
  // cuDNN's tensors are declared 16-byte aligned.
  static bool aligned16(std::initializer_list<const void*> ptrs) {
    for (const void* q : ptrs)
      if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;
    return true;
  }
  // A block with no mask at all (not causal, or causal with every key visible to every row)
  // whose buffers cuDNN can take (16-byte aligned).
  bool cudnn_eligible(const kernels::AttentionParams& p, std::initializer_list<const void*> ptrs) {
    if (!use_cudnn_) return false;
    if (!unmasked(p)) return false;
    if (!aligned16(ptrs)) return false;
    return cudnn() != nullptr;
  }
  static cuda::SdpaShape shape_of(const kernels::AttentionParams& p) {
    return {p.batch, p.sq, p.sk, p.hq, p.hkv, p.hd};
  }
  // The cuDNN SDPA runner, made on first use; nullptr (and cuDNN off) if cuDNN cannot start.
  cuda::CudnnAttention* cudnn() {
    if (!cudnn_ && use_cudnn_) {
      try {
        cudnn_ = std::make_unique<cuda::CudnnAttention>();
      } catch (const Error& e) {
        cudnn_decline_ = e.what();
        use_cudnn_ = false;
      }
    }
    return cudnn_.get();
  }
  // Passes `ok` through after counting growth of the cuDNN workspace in the live bytes.
  bool after_cudnn(bool ok) {
    const int64_t ws = static_cast<int64_t>(cudnn_->workspace_bytes());
    if (ws > cudnn_ws_counted_) mem_->add(ws - cudnn_ws_counted_);
    cudnn_ws_counted_ = std::max(ws, cudnn_ws_counted_);
    return ok;
  }
  void note_decline() {
    if (cudnn_ && !cudnn_->last_decline().empty()) cudnn_decline_ = cudnn_->last_decline();
  }

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
  int* flag_ = nullptr;  // device int: set by kernels that find bad ids/labels
  bool use_cudnn_ = true;
  bool causal_graph_ = true;  // CudaBackendOptions::cudnn_causal_graph
  int64_t bwd_tile_ = 0;  // 0: ops::attention_bwd_tile(det_)
  bool det_ = true;
  std::unique_ptr<cuda::CudnnAttention> cudnn_;
  std::string last_path_ = "none", cudnn_decline_;
  std::shared_ptr<MemoryCounter> mem_ = std::make_shared<MemoryCounter>();
  cudaMemPool_t pool_ = nullptr;  // the device's default pool: stream-ordered scratch
  int64_t own_bytes_ = 0;         // cuBLASLt workspace + error flag
  int64_t cudnn_ws_counted_ = 0;  // cuDNN workspace counted so far (it only grows)
  std::unique_ptr<cuda_queue::StreamQueue> queue_;  // the compute stream as a Queue
  cudaStream_t copy_stream_ = nullptr;  // copy_async: copies beside the compute stream
  cudaEvent_t queued_ = nullptr;         // the compute stream's work before a copy
  cudaEvent_t copied_[kCopyEvents] = {};  // copy k's end: copied_[k % kCopyEvents]
  int64_t copy_seq_ = 0;                 // copies issued
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
