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
  EASYCTX_CHECK(offset >= 0 && offset + t.numel() <= numel(), "Tensor::slice_flat: [", offset, ", ",
                offset + t.numel(), ") outside ", describe());
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

}  // namespace easyctx::ops
