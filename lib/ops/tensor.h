// Tensors for the ops interface: a Tensor is a plain view (pointer, dtype, memory space,
// row-major shape of up to 4 dims) that owns nothing; a Buffer owns the memory, is
// allocated by a backend and frees it with that backend's deleter (RAII). Views are cheap
// to copy and are what every op takes, so a CUDA backend passes device pointers through
// the same calls and the model code never knows where its bytes live.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/dtype.h"

namespace easyctx::ops {

using easyctx::DType;
using easyctx::MemSpace;

// Bytes per element (BF16/F16 are 2) and the short name ("bf16"): core/dtype.h's.
size_t element_size(DType t);
const char* type_name(DType t);

constexpr int kMaxDims = 4;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  MemSpace space = MemSpace::Host;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};

  Tensor() = default;
  Tensor(void* p, DType t, std::initializer_list<int64_t> dims, MemSpace s = MemSpace::Host);

  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i < 0 ? ndim + i : i)); }
  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * element_size(dtype); }
  bool empty() const { return data == nullptr; }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // Same memory, new shape with the same element count.
  Tensor reshape(std::initializer_list<int64_t> dims) const;
  Tensor reshape(const std::vector<int64_t>& dims) const;
  // Rows [begin, begin+count) along dim 0 (contiguous, so still a plain view).
  Tensor rows(int64_t begin, int64_t count) const;
  // Elements [offset, offset+count) of the flattened tensor, as a view of `dims`.
  Tensor slice_flat(int64_t offset, std::initializer_list<int64_t> dims) const;
  std::string describe() const;  // "f32[16,4,8]"
};

// Owning memory for one tensor. Move-only; the deleter comes from the allocating backend.
class Buffer {
 public:
  using Deleter = std::function<void(void*)>;
  Buffer() = default;
  Buffer(void* p, size_t bytes, DType t, MemSpace s, Deleter del)
      : p_(p), bytes_(bytes), dtype_(t), space_(s), del_(std::move(del)) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void reset();
  void* data() const { return p_; }
  size_t bytes() const { return bytes_; }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return static_cast<int64_t>(bytes_ / element_size(dtype_)); }
  // A view of the first prod(dims) elements.
  Tensor view(std::initializer_list<int64_t> dims) const;
  Tensor flat() const { return view({numel()}); }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
  DType dtype_ = DType::F32;
  MemSpace space_ = MemSpace::Host;
  Deleter del_;
};

// Shape checks used by every backend; throw easyctx::Error naming the op and the tensors.
void check_same_dtype(const char* op, const Tensor& a, const Tensor& b);
void check_numel(const char* op, const char* name, const Tensor& t, int64_t expected);
// Backend::copy_2d's arguments: same dtype and memory space, 0 <= width <= both pitches, and
// both views long enough for their last row.
void check_copy_2d(const Tensor& dst, int64_t dst_pitch, const Tensor& src, int64_t src_pitch, int64_t rows,
                   int64_t width);
// Backend::rope's arguments: x [n, heads, head_dim] (head_dim even), positions i32[n],
// inv_freq f32[head_dim / 2]. Returns {n, heads, head_dim}. (Memory space and x's dtype are
// each backend's to check.)
struct RopeDims {
  int64_t n, heads, head_dim;
};
RopeDims check_rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq);
// Backend::rmsnorm_*'s row layout: w [D], rows of D in `rows_of` (x, and y / dy / dx in
// `same`), rstd [n]. Returns {n, D}.
struct RowDims {
  int64_t n, d;
};
RowDims check_rmsnorm(const char* op, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      std::initializer_list<const Tensor*> same);
// Backend::matmul's shapes: 2-D views with op(A) [m, k], op(B) [k, n], C [m, n].
struct MatmulDims {
  int64_t m, n, k;
};
MatmulDims check_matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c);
// Backend::embedding_*'s shapes: ids i32[n], table [V, D], rows [n, D] (the output or its
// gradient, of the table's dtype). Returns {n, V, D}.
struct EmbeddingDims {
  int64_t n, vocab, d;
};
EmbeddingDims check_embedding(const char* op, const Tensor& ids, const Tensor& table, const Tensor& rows);

// Backend::lm_head_score's arguments: w [V, D] (2-D), x [n, D] of w's dtype and memory space,
// labels i32[n] in that space, nll f64[n] and top i32[n] in host memory. Returns {n, V, D}.
EmbeddingDims check_lm_head_score(const Tensor& x, const Tensor& w, const Tensor& labels, const Tensor& nll,
                                  const Tensor& top);

}  // namespace easyctx::ops
