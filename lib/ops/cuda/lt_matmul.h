// Row-major C = alpha op(A) op(B) + beta C through cuBLASLt (fp32 accumulation), with the
// heuristic's algorithm cached per problem (shape, transposes, dtypes, leading dims).
// Supported (A/B, C): (f32, f32) exact fp32; (bf16, bf16) and (bf16, f32).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "ops/tensor.h"

namespace easyctx::ops::cuda {

class LtMatmul {
 public:
  explicit LtMatmul(size_t workspace_bytes);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // a [a_rows, a_cols], b [b_rows, b_cols], c [m, n], all row-major and contiguous.
  void run(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, float alpha, float beta,
           cudaStream_t st);

 private:
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int, int>;  // m n k ta tb ab_type c_type
  Plan& plan(const Key& key);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace easyctx::ops::cuda
