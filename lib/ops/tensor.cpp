#include "ops/tensor.h"

#include <sstream>

namespace easyctx::ops {

size_t element_size(DType t) { return easyctx::dtype_size(t); }
const char* type_name(DType t) { return easyctx::dtype_name(t); }

Tensor::Tensor(void* p, DType t, std::initializer_list<int64_t> dims, MemSpace s) : data(p), dtype(t), space(s) {
  EASYCTX_CHECK(dims.size() <= static_cast<size_t>(kMaxDims), "Tensor: at most ", kMaxDims, " dims, got ", dims.size());
  for (int64_t d : dims) {
    EASYCTX_CHECK(d >= 0, "Tensor: negative dimension ", d);
    shape[static_cast<size_t>(ndim++)] = d;
  }
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[static_cast<size_t>(i)];
  return n;
}

Tensor Tensor::reshape(std::initializer_list<int64_t> dims) const {
  Tensor t(data, dtype, dims, space);
  EASYCTX_CHECK(t.numel() == numel(), "Tensor::reshape: ", describe(), " has ", numel(), " elements, new shape ",
                t.describe(), " has ", t.numel());
  return t;
}

Tensor Tensor::reshape(const std::vector<int64_t>& dims) const {
  EASYCTX_CHECK(dims.size() <= static_cast<size_t>(kMaxDims), "Tensor::reshape: at most ", kMaxDims, " dims");
  Tensor t = *this;
  t.ndim = 0;
  for (int64_t d : dims) t.shape[static_cast<size_t>(t.ndim++)] = d;
  EASYCTX_CHECK(t.numel() == numel(), "Tensor::reshape: ", describe(), " has ", numel(), " elements, new shape ",
                t.describe(), " has ", t.numel());
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t count) const {
  EASYCTX_CHECK(ndim >= 1 && begin >= 0 && count >= 0 && begin + count <= shape[0], "Tensor::rows: [", begin, ", ",
                begin + count, ") outside ", describe());
  Tensor t = *this;
  int64_t row = numel() / (shape[0] ? shape[0] : 1);
  t.data = static_cast<char*>(data) + static_cast<size_t>(begin * row) * element_size(dtype);
  t.shape[0] = count;
  return t;
}

Tensor Tensor::slice_flat(int64_t offset, std::initializer_list<int64_t> dims) const {
  Tensor t(static_cast<char*>(data) + static_cast<size_t>(offset) * element_size(dtype), dtype, dims, space);
  EASYCTX_CHECK(offset >= 0 && offset + t.numel() <= numel(), "Tensor::slice_flat: [", offset, ", ", offset + t.numel(),
                ") outside ", describe());
  return t;
}

std::string Tensor::describe() const {
  std::ostringstream os;
  os << type_name(dtype) << "[";
  for (int i = 0; i < ndim; ++i) os << (i ? "," : "") << shape[static_cast<size_t>(i)];
  os << "]";
  return os.str();
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    p_ = o.p_;
    bytes_ = o.bytes_;
    dtype_ = o.dtype_;
    space_ = o.space_;
    del_ = std::move(o.del_);
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Buffer::reset() {
  if (p_ && del_) del_(p_);
  p_ = nullptr;
  bytes_ = 0;
}

Tensor Buffer::view(std::initializer_list<int64_t> dims) const {
  Tensor t(p_, dtype_, dims, space_);
  EASYCTX_CHECK(t.bytes() <= bytes_, "Buffer::view: ", t.describe(), " exceeds the buffer's ", bytes_, " bytes");
  return t;
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  EASYCTX_CHECK(a.dtype == b.dtype, op, ": dtype mismatch ", a.describe(), " vs ", b.describe());
}

void check_numel(const char* op, const char* name, const Tensor& t, int64_t expected) {
  EASYCTX_CHECK(t.numel() == expected, op, ": ", name, " is ", t.describe(), ", expected ", expected, " elements");
}

void check_copy_2d(const Tensor& dst, int64_t dst_pitch, const Tensor& src, int64_t src_pitch, int64_t rows,
                   int64_t width) {
  check_same_dtype("copy_2d", dst, src);
  EASYCTX_CHECK(dst.space == src.space, "copy_2d: dst ", dst.describe(), " and src ", src.describe(),
                " are in different memory spaces");
  EASYCTX_CHECK(rows >= 0 && width >= 0 && width <= dst_pitch && width <= src_pitch, "copy_2d: ", rows, " rows of ",
                width, " elements with pitches ", dst_pitch, " (dst) and ", src_pitch, " (src)");
  if (rows == 0 || width == 0) return;
  EASYCTX_CHECK(dst.numel() >= (rows - 1) * dst_pitch + width && src.numel() >= (rows - 1) * src_pitch + width,
                "copy_2d: ", rows, " rows of ", width, " elements (pitches ", dst_pitch, ", ", src_pitch,
                ") do not fit dst ", dst.describe(), " / src ", src.describe());
}

RopeDims check_rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq) {
  EASYCTX_CHECK(positions.dtype == DType::I32, "rope: positions must be i32, got ", positions.describe());
  EASYCTX_CHECK(inv_freq.dtype == DType::F32, "rope: inv_freq must be f32, got ", inv_freq.describe());
  EASYCTX_CHECK(x.ndim == 3, "rope: x must be [n, heads, head_dim], got ", x.describe());
  const RopeDims r{x.dim(0), x.dim(1), x.dim(2)};
  EASYCTX_CHECK(r.head_dim % 2 == 0, "rope: odd head_dim ", r.head_dim);
  check_numel("rope", "positions", positions, r.n);
  check_numel("rope", "inv_freq", inv_freq, r.head_dim / 2);
  return r;
}

RowDims check_rmsnorm(const char* op, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      std::initializer_list<const Tensor*> same) {
  const int64_t d = w.numel();
  EASYCTX_CHECK(d > 0, op, ": empty weight ", w.describe());
  const RowDims r{x.numel() / d, d};
  check_numel(op, "x", x, r.n * d);
  for (const Tensor* t : same) check_numel(op, "y/dy/dx", *t, r.n * d);
  check_numel(op, "rstd", rstd, r.n);
  return r;
}

MatmulDims check_matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c) {
  EASYCTX_CHECK(a.ndim == 2 && b.ndim == 2 && c.ndim == 2, "matmul: 2-D views expected, got ", a.describe(), " ",
                b.describe(), " ", c.describe());
  const MatmulDims r{trans_a ? a.dim(1) : a.dim(0), trans_b ? b.dim(0) : b.dim(1), trans_a ? a.dim(0) : a.dim(1)};
  const int64_t kb = trans_b ? b.dim(1) : b.dim(0);
  EASYCTX_CHECK(r.k == kb && c.dim(0) == r.m && c.dim(1) == r.n, "matmul: shapes do not agree: op(A) ", r.m, "x", r.k,
                ", op(B) ", kb, "x", r.n, ", C ", c.describe());
  return r;
}

EmbeddingDims check_embedding(const char* op, const Tensor& ids, const Tensor& table, const Tensor& rows) {
  EASYCTX_CHECK(ids.dtype == DType::I32, op, ": ids must be i32, got ", ids.describe());
  check_same_dtype(op, table, rows);
  const int64_t d = table.dim(-1);
  const EmbeddingDims r{ids.numel(), d > 0 ? table.numel() / d : 0, d};
  check_numel(op, "rows", rows, r.n * d);
  return r;
}

EmbeddingDims check_lm_head_score(const Tensor& x, const Tensor& w, const Tensor& labels, const Tensor& nll,
                                  const Tensor& top) {
  const char* op = "lm_head_score";
  check_same_dtype(op, x, w);
  EASYCTX_CHECK(x.space == w.space && labels.space == w.space, op, ": x ", x.describe(), ", w ", w.describe(),
                " and labels ", labels.describe(), " must be in one memory space");
  EASYCTX_CHECK(labels.dtype == DType::I32, op, ": labels must be i32, got ", labels.describe());
  EASYCTX_CHECK(nll.dtype == DType::F64 && nll.space == MemSpace::Host, op, ": nll must be host f64, got ",
                nll.describe());
  EASYCTX_CHECK(top.dtype == DType::I32 && top.space == MemSpace::Host, op, ": top must be host i32, got ",
                top.describe());
  const int64_t d = w.dim(-1);
  EASYCTX_CHECK(w.ndim == 2 && d > 0, op, ": w must be [V, D], got ", w.describe());
  const EmbeddingDims r{labels.numel(), w.numel() / d, d};
  check_numel(op, "x", x, r.n * d);
  check_numel(op, "nll", nll, r.n);
  check_numel(op, "top", top, r.n);
  return r;
}

}  // namespace easyctx::ops
