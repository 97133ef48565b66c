// The CPU reference backend: checks shapes, then dispatches on dtype (f32 or f64) to the
// templated kernels in kernels.cpp and gemm.cpp.
#include <omp.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "ops/cpu/gemm.h"
#include "ops/cpu/kernels.h"
#include "ops/half.h"
#include "ops/memory_counter.h"
#include "ops/ops.h"

namespace easyctx::ops {
namespace {

using cpu::Stat;

void check_host(const char* op, const Tensor& t) {
  EASYCTX_CHECK(t.space == MemSpace::Host, op, ": the CPU backend needs host memory, got a device tensor ",
                t.describe());
}

void check_float(const char* op, const Tensor& t) {
  check_host(op, t);
  EASYCTX_CHECK(t.dtype == DType::F32 || t.dtype == DType::F64, op, ": the CPU backend computes in f32 or f64, got ",
                t.describe());
}

void check_type(const char* op, const char* name, const Tensor& t, DType want) {
  check_host(op, t);
  EASYCTX_CHECK(t.dtype == want, op, ": ", name, " must be ", type_name(want), ", got ", t.describe());
}

// Statistics (LSE, rstd) are f32 for f32 data and f64 for f64 data.
DType stat_type(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

double read_as_double(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: return t.ptr<float>()[i];
    case DType::F64: return t.ptr<double>()[i];
    case DType::BF16: return bf16_to_float(t.ptr<uint16_t>()[i]);
    case DType::F16: return f16_to_float(t.ptr<uint16_t>()[i]);
    case DType::I32: return t.ptr<int32_t>()[i];
    default: EASYCTX_THROW("copy: unsupported source dtype ", t.describe());
  }
}

void write_from_double(const Tensor& t, int64_t i, double x) {
  switch (t.dtype) {
    case DType::F32: t.ptr<float>()[i] = static_cast<float>(x); break;
    case DType::F64: t.ptr<double>()[i] = x; break;
    case DType::BF16: t.ptr<uint16_t>()[i] = float_to_bf16(static_cast<float>(x)); break;
    case DType::F16: t.ptr<uint16_t>()[i] = float_to_f16(static_cast<float>(x)); break;
    case DType::I32: t.ptr<int32_t>()[i] = static_cast<int32_t>(x); break;
    default: EASYCTX_THROW("copy: unsupported destination dtype ", t.describe());
  }
}

// Zeroed host memory of `bytes` (> 0), 64-byte aligned. A large buffer (the host optimizer's
// fp32 state: 91 GB for a 7.6B model) is 2 MiB aligned with transparent huge pages asked for
// (fewer page faults and TLB misses for the host AdamW's streams) and first touched by every
// thread in parallel: one thread's memset of it, page fault by page fault, was most of a
// 7-8B run's start-up (and pages left untouched would fault inside the first steps instead).
void* zeroed_host_memory(size_t bytes) {
  constexpr size_t kLarge = size_t{64} << 20, kHuge = size_t{2} << 20;
  if (bytes < kLarge) {
    void* p = std::aligned_alloc(64, bytes);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    return p;
  }
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, rounded);
  if (!p) throw std::bad_alloc();
#if defined(MADV_HUGEPAGE)
  madvise(p, rounded, MADV_HUGEPAGE);  // (advice: without THP support it is refused, harmlessly)
#endif
  auto* c = static_cast<char*>(p);
  const int64_t blocks = static_cast<int64_t>(rounded / kHuge);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) std::memset(c + static_cast<size_t>(b) * kHuge, 0, kHuge);
  return p;
}

// Every CPU backend's allocations together (cpu_process_memory_stats).
MemoryCounter& process_counter() {
  static MemoryCounter* c = new MemoryCounter;  // never destroyed: Buffers may be freed at exit
  return *c;
}

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  MemSpace memspace() const override { return MemSpace::Host; }

  // Counts the bytes asked for (the 64-byte rounding is not counted).
  Buffer allocate(DType t, int64_t numel, const char*) override {
    EASYCTX_CHECK(numel >= 0, "alloc: negative element count ", numel);
    size_t bytes = static_cast<size_t>(numel) * element_size(t);
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = rounded ? zeroed_host_memory(rounded) : nullptr;
    const int64_t counted = static_cast<int64_t>(bytes);
    mem_->add(counted);
    process_counter().add(counted);
    return Buffer(p, bytes, t, MemSpace::Host, [mem = mem_, counted](void* q) {
      std::free(q);
      mem->sub(counted);
      process_counter().sub(counted);
    });
  }

  MemoryStats memory_stats() const override { return {mem_->live(), mem_->peak(), 0}; }
  void reset_peak_memory() override { mem_->reset_peak(); }

  // Host memory is all there is: "pinned" buffers are ordinary (counted) buffers and copies
  // are done when copy_async returns, so the offload path runs here as on a device.
  Buffer allocate_host_pinned(DType t, int64_t numel, const char* what) override { return alloc(t, numel, what); }
  CopyFence copy_async(const Tensor& dst, const Tensor& src) override {
    check_same_dtype("copy_async", dst, src);
    copy(dst, src);
    return {};
  }
  void wait_copy(CopyFence) override {}
  void copy_on(Queue&, const Tensor& dst, const Tensor& src) override {
    check_same_dtype("copy_on", dst, src);
    copy(dst, src);
  }

  void copy(const Tensor& dst, const Tensor& src) override {
    check_host("copy", dst);
    check_host("copy", src);
    check_numel("copy", "dst", dst, src.numel());
    if (dst.dtype == src.dtype) {
      std::memcpy(dst.data, src.data, src.bytes());
      return;
    }
    const int64_t n = src.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) write_from_double(dst, i, read_as_double(src, i));
  }

  void copy_2d(const Tensor& dst, int64_t dst_pitch, const Tensor& src, int64_t src_pitch, int64_t rows,
               int64_t width) override {
    check_host("copy_2d", dst);
    check_copy_2d(dst, dst_pitch, src, src_pitch, rows, width);
    const size_t es = element_size(dst.dtype);
    auto* d = static_cast<char*>(dst.data);
    const auto* s = static_cast<const char*>(src.data);
#pragma omp parallel for schedule(static) if (rows * width > (1 << 16))
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(d + static_cast<size_t>(r * dst_pitch) * es, s + static_cast<size_t>(r * src_pitch) * es,
                  static_cast<size_t>(width) * es);
  }

  void fill(const Tensor& x, double value) override {
    check_float("fill", x);
    const int64_t n = x.numel();
    if (x.dtype == DType::F32) std::fill(x.ptr<float>(), x.ptr<float>() + n, static_cast<float>(value));
    else std::fill(x.ptr<double>(), x.ptr<double>() + n, value);
  }

  void axpy(const Tensor& y, const Tensor& x, double alpha) override {
    check_float("axpy", y);
    check_same_dtype("axpy", y, x);
    check_numel("axpy", "x", x, y.numel());
    if (y.dtype == DType::F32) axpy_t(y.ptr<float>(), x.ptr<float>(), y.numel(), alpha);
    else axpy_t(y.ptr<double>(), x.ptr<double>(), y.numel(), alpha);
  }

  void scale(const Tensor& x, double alpha) override {
    check_float("scale", x);
    if (x.dtype == DType::F32) scale_t(x.ptr<float>(), x.numel(), alpha);
    else scale_t(x.ptr<double>(), x.numel(), alpha);
  }

  double sum_squares(const Tensor& x) override {
    check_float("sum_squares", x);
    return x.dtype == DType::F32 ? sumsq_t(x.ptr<float>(), x.numel()) : sumsq_t(x.ptr<double>(), x.numel());
  }

  void embedding_fwd(const Tensor& ids, const Tensor& table, const Tensor& out) override {
    check_host("embedding_fwd", ids);
    check_float("embedding_fwd", table);
    const EmbeddingDims e = check_embedding("embedding_fwd", ids, table, out);
    if (table.dtype == DType::F32)
      cpu::embedding_fwd(ids.ptr<int32_t>(), e.n, table.ptr<float>(), e.vocab, e.d, out.ptr<float>());
    else cpu::embedding_fwd(ids.ptr<int32_t>(), e.n, table.ptr<double>(), e.vocab, e.d, out.ptr<double>());
  }

  void embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dtable) override {
    check_host("embedding_bwd", ids);
    check_float("embedding_bwd", dtable);
    const EmbeddingDims e = check_embedding("embedding_bwd", ids, dtable, dout);
    if (dtable.dtype == DType::F32)
      cpu::embedding_bwd(ids.ptr<int32_t>(), e.n, dout.ptr<float>(), e.vocab, e.d, dtable.ptr<float>());
    else cpu::embedding_bwd(ids.ptr<int32_t>(), e.n, dout.ptr<double>(), e.vocab, e.d, dtable.ptr<double>());
  }

  void rmsnorm_fwd(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd) override {
    check_float("rmsnorm_fwd", x);
    check_same_dtype("rmsnorm_fwd", x, w);
    check_same_dtype("rmsnorm_fwd", x, y);
    check_type("rmsnorm_fwd", "rstd", rstd, stat_type(x.dtype));
    const RowDims rows = check_rmsnorm("rmsnorm_fwd", x, w, rstd, {&y});
    const int64_t n = rows.n, d = rows.d;
    if (x.dtype == DType::F32)
      cpu::rmsnorm_fwd(x.ptr<float>(), w.ptr<float>(), n, d, eps, y.ptr<float>(), rstd.ptr<float>());
    else cpu::rmsnorm_fwd(x.ptr<double>(), w.ptr<double>(), n, d, eps, y.ptr<double>(), rstd.ptr<double>());
  }

  void rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                   const Tensor& dw) override {
    check_float("rmsnorm_bwd", x);
    for (const Tensor* t : {&w, &dy, &dx}) check_same_dtype("rmsnorm_bwd", x, *t);
    check_type("rmsnorm_bwd", "rstd", rstd, stat_type(x.dtype));
    const RowDims rows = check_rmsnorm("rmsnorm_bwd", x, w, rstd, {&dy, &dx});
    const int64_t n = rows.n, d = rows.d;
    if (!dw.empty()) check_numel("rmsnorm_bwd", "dw", dw, d);
    if (x.dtype == DType::F32)
      cpu::rmsnorm_bwd(x.ptr<float>(), w.ptr<float>(), rstd.ptr<float>(), dy.ptr<float>(), n, d, dx.ptr<float>(),
                       dw.ptr<float>());
    else
      cpu::rmsnorm_bwd(x.ptr<double>(), w.ptr<double>(), rstd.ptr<double>(), dy.ptr<double>(), n, d, dx.ptr<double>(),
                       dw.ptr<double>());
  }

  void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, double alpha,
              double beta) override {
    check_float("matmul", a);
    check_same_dtype("matmul", a, b);
    check_same_dtype("matmul", a, c);
    const MatmulDims dims = check_matmul(a, trans_a, b, trans_b, c);
    const int64_t m = dims.m, n = dims.n, k = dims.k;
    if (a.dtype == DType::F32)
      cpu::gemm<float>(trans_a, trans_b, m, n, k, static_cast<float>(alpha), a.ptr<float>(), a.dim(1), b.ptr<float>(),
                       b.dim(1), static_cast<float>(beta), c.ptr<float>(), n);
    else
      cpu::gemm<double>(trans_a, trans_b, m, n, k, alpha, a.ptr<double>(), a.dim(1), b.ptr<double>(), b.dim(1), beta,
                        c.ptr<double>(), n);
  }

  void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, bool inverse) override {
    check_float("rope", x);
    check_host("rope", positions);
    check_host("rope", inv_freq);
    const RopeDims r = check_rope(x, positions, inv_freq);
    if (x.dtype == DType::F32)
      cpu::rope(x.ptr<float>(), r.n, r.heads, r.head_dim, positions.ptr<int32_t>(), inv_freq.ptr<float>(), inverse);
    else cpu::rope(x.ptr<double>(), r.n, r.heads, r.head_dim, positions.ptr<int32_t>(), inv_freq.ptr<float>(), inverse);
  }

  static cpu::AttnShape attn_shape(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
    EASYCTX_CHECK(q.ndim == 4 && k.ndim == 4 && v.ndim == 4, op, ": q, k, v must be [B, S, H, hd], got ", q.describe(),
                  " ", k.describe(), " ", v.describe());
    cpu::AttnShape s{q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3)};
    EASYCTX_CHECK(k.shape == v.shape && k.dim(0) == s.batch && k.dim(3) == s.hd, op, ": k ", k.describe(), " / v ",
                  v.describe(), " do not match q ", q.describe());
    EASYCTX_CHECK(s.hkv > 0 && s.hq % s.hkv == 0, op, ": query heads ", s.hq, " not a multiple of kv heads ", s.hkv);
    return s;
  }

  void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionBlock& blk, const Tensor& o,
                     const Tensor& lse) override {
    check_float("attention_fwd", q);
    for (const Tensor* t : {&k, &v, &o}) check_same_dtype("attention_fwd", q, *t);
    check_type("attention_fwd", "lse", lse, stat_type(q.dtype));
    const cpu::AttnShape s = attn_shape("attention_fwd", q, k, v);
    check_numel("attention_fwd", "o", o, q.numel());
    check_numel("attention_fwd", "lse", lse, s.batch * s.hq * s.sq);
    if (q.dtype == DType::F32)
      cpu::attention_fwd(q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), s, blk, o.ptr<float>(), lse.ptr<float>());
    else
      cpu::attention_fwd(q.ptr<double>(), k.ptr<double>(), v.ptr<double>(), s, blk, o.ptr<double>(), lse.ptr<double>());
  }

  void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                     const Tensor& dout, const AttentionBlock& blk, const Tensor& dq, const Tensor& dk,
                     const Tensor& dv) override {
    check_float("attention_bwd", q);
    for (const Tensor* t : {&k, &v, &o, &dout, &dq, &dk, &dv}) check_same_dtype("attention_bwd", q, *t);
    check_type("attention_bwd", "lse", lse, stat_type(q.dtype));
    const cpu::AttnShape s = attn_shape("attention_bwd", q, k, v);
    for (const Tensor* t : {&o, &dout, &dq}) check_numel("attention_bwd", "o/dout/dq", *t, q.numel());
    for (const Tensor* t : {&dk, &dv}) check_numel("attention_bwd", "dk/dv", *t, k.numel());
    check_numel("attention_bwd", "lse", lse, s.batch * s.hq * s.sq);
    if (!blk.accumulate)
      for (const Tensor* t : {&dq, &dk, &dv}) fill(*t, 0.0);
    if (q.dtype == DType::F32)
      cpu::attention_bwd(q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), o.ptr<float>(), lse.ptr<float>(),
                         dout.ptr<float>(), s, blk, dq.ptr<float>(), dk.ptr<float>(), dv.ptr<float>());
    else
      cpu::attention_bwd(q.ptr<double>(), k.ptr<double>(), v.ptr<double>(), o.ptr<double>(), lse.ptr<double>(),
                         dout.ptr<double>(), s, blk, dq.ptr<double>(), dk.ptr<double>(), dv.ptr<double>());
  }

  void attention_merge(const Tensor& o, const Tensor& lse, const Tensor& o_blk, const Tensor& lse_blk) override {
    check_float("attention_merge", o);
    check_same_dtype("attention_merge", o, o_blk);
    check_type("attention_merge", "lse", lse, stat_type(o.dtype));
    check_type("attention_merge", "lse_blk", lse_blk, stat_type(o.dtype));
    EASYCTX_CHECK(o.ndim == 4 && o.shape == o_blk.shape, "attention_merge: o ", o.describe(), " vs o_blk ",
                  o_blk.describe());
    const int64_t b = o.dim(0), sq = o.dim(1), hq = o.dim(2), hd = o.dim(3);
    check_numel("attention_merge", "lse", lse, b * hq * sq);
    check_numel("attention_merge", "lse_blk", lse_blk, b * hq * sq);
    if (o.dtype == DType::F32)
      cpu::attention_merge(o.ptr<float>(), lse.ptr<float>(), o_blk.ptr<float>(), lse_blk.ptr<float>(), b, sq, hq, hd);
    else
      cpu::attention_merge(o.ptr<double>(), lse.ptr<double>(), o_blk.ptr<double>(), lse_blk.ptr<double>(), b, sq, hq,
                           hd);
  }

  void swiglu_fwd(const Tensor& g, const Tensor& u, const Tensor& h) override {
    check_float("swiglu_fwd", g);
    check_same_dtype("swiglu_fwd", g, u);
    check_same_dtype("swiglu_fwd", g, h);
    check_numel("swiglu_fwd", "u", u, g.numel());
    check_numel("swiglu_fwd", "h", h, g.numel());
    if (g.dtype == DType::F32) cpu::swiglu_fwd(g.ptr<float>(), u.ptr<float>(), g.numel(), h.ptr<float>());
    else cpu::swiglu_fwd(g.ptr<double>(), u.ptr<double>(), g.numel(), h.ptr<double>());
  }

  void swiglu_bwd(const Tensor& g, const Tensor& u, const Tensor& dh, const Tensor& dg, const Tensor& du) override {
    check_float("swiglu_bwd", g);
    for (const Tensor* t : {&u, &dh, &dg, &du}) {
      check_same_dtype("swiglu_bwd", g, *t);
      check_numel("swiglu_bwd", "u/dh/dg/du", *t, g.numel());
    }
    if (g.dtype == DType::F32)
      cpu::swiglu_bwd(g.ptr<float>(), u.ptr<float>(), dh.ptr<float>(), g.numel(), dg.ptr<float>(), du.ptr<float>());
    else
      cpu::swiglu_bwd(g.ptr<double>(), u.ptr<double>(), dh.ptr<double>(), g.numel(), dg.ptr<double>(),
                      du.ptr<double>());
  }

  LossSums lm_head_loss(const Tensor& x, const Tensor& w, const Tensor& labels, int64_t tile_tokens, double grad_scale,
                        const Tensor& dx, const Tensor& dw) override {
    check_float("lm_head_loss", x);
    check_same_dtype("lm_head_loss", x, w);
    check_type("lm_head_loss", "labels", labels, DType::I32);
    const int64_t d = w.dim(-1), vocab = w.numel() / d, n = labels.numel();
    check_numel("lm_head_loss", "x", x, n * d);
    if (!dx.empty()) {
      check_same_dtype("lm_head_loss", x, dx);
      check_numel("lm_head_loss", "dx", dx, n * d);
    }
    if (!dw.empty()) {
      check_same_dtype("lm_head_loss", x, dw);
      check_numel("lm_head_loss", "dw", dw, vocab * d);
    }
    if (x.dtype == DType::F32)
      return cpu::lm_head_loss(x.ptr<float>(), w.ptr<float>(), labels.ptr<int32_t>(), n, d, vocab, tile_tokens,
                               grad_scale, dx.ptr<float>(), dw.ptr<float>());
    return cpu::lm_head_loss(x.ptr<double>(), w.ptr<double>(), labels.ptr<int32_t>(), n, d, vocab, tile_tokens,
                             grad_scale, dx.ptr<double>(), dw.ptr<double>());
  }

  void lm_head_score(const Tensor& x, const Tensor& w, const Tensor& labels, int64_t tile_tokens, const Tensor& nll,
                     const Tensor& top) override {
    check_float("lm_head_score", x);
    check_host("lm_head_score", w);
    const EmbeddingDims dims = check_lm_head_score(x, w, labels, nll, top);
    if (dims.n == 0) return;
    if (x.dtype == DType::F32)
      cpu::lm_head_score(x.ptr<float>(), w.ptr<float>(), labels.ptr<int32_t>(), dims.n, dims.d, dims.vocab, tile_tokens,
                         nll.ptr<double>(), top.ptr<int32_t>());
    else
      cpu::lm_head_score(x.ptr<double>(), w.ptr<double>(), labels.ptr<int32_t>(), dims.n, dims.d, dims.vocab,
                         tile_tokens, nll.ptr<double>(), top.ptr<int32_t>());
  }

  void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWStep& s) override {
    for (const Tensor* t : {&param, &grad, &m, &v}) {
      check_type("adamw", "param/grad/m/v", *t, DType::F32);
      check_numel("adamw", "grad/m/v", *t, param.numel());
    }
    cpu::adamw(param.ptr<float>(), grad.ptr<float>(), m.ptr<float>(), v.ptr<float>(), param.numel(), s);
  }

 private:
  std::shared_ptr<MemoryCounter> mem_ = std::make_shared<MemoryCounter>();

  template <typename T>
  static void axpy_t(T* y, const T* x, int64_t n, double alpha) {
    const T a = static_cast<T>(alpha);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
  }
  template <typename T>
  static void scale_t(T* x, int64_t n, double alpha) {
    const T a = static_cast<T>(alpha);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) x[i] *= a;
  }
  // Fixed-size chunks summed in order: the result does not depend on the thread count.
  template <typename T>
  static double sumsq_t(const T* x, int64_t n) {
    const int64_t chunk = 1 << 14, chunks = (n + chunk - 1) / chunk;
    std::vector<double> part(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      double s = 0;
      for (int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i) s += static_cast<double>(x[i]) * x[i];
      part[static_cast<size_t>(c)] = s;
    }
    double s = 0;
    for (double p : part) s += p;
    return s;
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

MemoryStats cpu_process_memory_stats() { return {process_counter().live(), process_counter().peak(), 0}; }
void reset_cpu_process_peak_memory() { process_counter().reset_peak(); }

}  // namespace easyctx::ops
