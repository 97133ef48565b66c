#include "ops/cuda/lt_matmul.h"

#include "kernels/cuda_check.h"
#include "ops/cuda/cublaslt_api.h"

#define EASYCTX_CUBLAS_CHECK(call)                                                                             \
  do {                                                                                                         \
    cublasStatus_t easyctx_st_ = (call);                                                                       \
    if (easyctx_st_ != CUBLAS_STATUS_SUCCESS)                                                                  \
      EASYCTX_THROW(::easyctx::process_label(), " cuBLASLt error ", cublaslt().status_name(easyctx_st_), " (", \
                    cublaslt().status_string(easyctx_st_), ") in ", #call, " at ", __FILE__, ":", __LINE__);   \
  } while (0)

namespace easyctx::ops::cuda {

// cuBLASLt is column-major: a row-major X [r, c] is the column-major X^T [c, r] with ld c.
// So row-major C = op(A) op(B) is computed as column-major C^T = op(B)^T op(A)^T: the Lt
// "A" is our B (transposed iff trans_b), the Lt "B" is our A (transposed iff trans_a).
struct LtMatmul::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (la) cublaslt().layout_destroy(la);
    if (lb) cublaslt().layout_destroy(lb);
    if (lc) cublaslt().layout_destroy(lc);
    if (desc) cublaslt().desc_destroy(desc);
  }
};

namespace {
cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    default: EASYCTX_THROW("matmul (CUDA): unsupported dtype ", type_name(t), " (f32 or bf16)");
  }
}
}  // namespace

LtMatmul::LtMatmul(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  EASYCTX_CUBLAS_CHECK(cublaslt().create(&handle_));
  if (workspace_bytes_) EASYCTX_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

LtMatmul::~LtMatmul() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublaslt().destroy(handle_);
}

LtMatmul::Plan& LtMatmul::plan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  const auto [m, n, k, ta, tb, ab_i, c_i] = key;
  const cudaDataType_t ab = lt_type(static_cast<DType>(ab_i)), ct = lt_type(static_cast<DType>(c_i));
  auto p = std::make_unique<Plan>();
  EASYCTX_CUBLAS_CHECK(cublaslt().desc_create(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  EASYCTX_CUBLAS_CHECK(cublaslt().desc_set_attribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  EASYCTX_CUBLAS_CHECK(cublaslt().desc_set_attribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  // Lt A = our B: stored column-major as [b_cols, b_rows]; op gives [n, k].
  const uint64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
  const uint64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
  EASYCTX_CUBLAS_CHECK(cublaslt().layout_create(&p->la, ab, b_cols, b_rows, static_cast<int64_t>(b_cols)));
  EASYCTX_CUBLAS_CHECK(cublaslt().layout_create(&p->lb, ab, a_cols, a_rows, static_cast<int64_t>(a_cols)));
  EASYCTX_CUBLAS_CHECK(cublaslt().layout_create(&p->lc, ct, static_cast<uint64_t>(n), static_cast<uint64_t>(m), n));
  cublasLtMatmulPreference_t pref = nullptr;
  EASYCTX_CUBLAS_CHECK(cublaslt().preference_create(&pref));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  cublasStatus_t st = cublaslt().preference_set_attribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                          &workspace_bytes_, sizeof(workspace_bytes_));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublaslt().algo_get_heuristic(handle_, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &found);
  cublaslt().preference_destroy(pref);
  EASYCTX_CUBLAS_CHECK(st);
  EASYCTX_CHECK(found > 0, "matmul (CUDA): cuBLASLt found no algorithm for C[", m, ",", n, "] = op(A) op(B), k=", k,
                ", trans_a=", ta, ", trans_b=", tb, ", A/B ", type_name(static_cast<DType>(ab_i)), ", C ",
                type_name(static_cast<DType>(c_i)));
  p->algo = res.algo;
  return *plans_.emplace(key, std::move(p)).first->second;
}

void LtMatmul::run(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, float alpha,
                   float beta, cudaStream_t st) {
  const int64_t m = trans_a ? a.dim(1) : a.dim(0), k = trans_a ? a.dim(0) : a.dim(1);
  const int64_t n = trans_b ? b.dim(0) : b.dim(1);
  if (m == 0 || n == 0) return;
  const Key key{m, n, k, trans_a, trans_b, static_cast<int>(a.dtype), static_cast<int>(c.dtype)};
  Plan& p = plan(key);
  EASYCTX_CUBLAS_CHECK(cublaslt().matmul(handle_, p.desc, &alpha, b.data, p.la, a.data, p.lb, &beta, c.data, p.lc,
                                         c.data, p.lc, &p.algo, workspace_, workspace_bytes_, st));
}

}  // namespace easyctx::ops::cuda
