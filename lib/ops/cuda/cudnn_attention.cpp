#include "ops/cuda/cudnn_attention.h"

#include <cudnn.h>

#include <initializer_list>
#include <limits>
#include <vector>

#include "kernels/cuda_check.h"

namespace easyctx::ops::cuda {

#if CUDNN_VERSION >= 91900
namespace {

// Graph-building failures are "declines" (no plan: fall back); execution failures throw.
struct Decline {
  std::string what;
};

void ok(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  throw Decline{std::string(what) + ": " + cudnnGetErrorString(s) +
                (detail[0] ? std::string(" (") + detail + ")" : "")};
}

// Owns every backend descriptor made while building one plan.
struct Descs {
  std::vector<cudnnBackendDescriptor_t> all;
  ~Descs() {
    for (auto it = all.rbegin(); it != all.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t) {
    cudnnBackendDescriptor_t d = nullptr;
    ok(cudnnBackendCreateDescriptor(t, &d), "cudnnBackendCreateDescriptor");
    all.push_back(d);
    return d;
  }
};

void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n,
         const void* v, const char* what) {
  ok(cudnnBackendSetAttribute(d, a, t, n, v), what);
}
void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendDescriptor_t v, const char* what) {
  set(d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
}

// A 4-D tensor [b, h, s, d] given by dims and strides (elements).
enum class Kind { Real, ByValue, Virtual };
cudnnBackendDescriptor_t tensor(Descs& ds, int64_t uid, const int64_t (&dims)[4], const int64_t (&strides)[4],
                                cudnnDataType_t type, Kind kind = Kind::Real) {
  const bool by_value = kind == Kind::ByValue;
  cudnnBackendDescriptor_t t = ds.make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t align = by_value ? 4 : 16;
  set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor data type");
  set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, "tensor dims");
  set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, "tensor strides");
  set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
  set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
  if (by_value) {
    const bool yes = true;
    set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, "tensor by value");
  }
  if (kind == Kind::Virtual) {
    const bool yes = true;
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, "tensor virtual");
  }
  ok(cudnnBackendFinalize(t), "finalize tensor");
  return t;
}

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kDO, kDQ, kDK, kDV, kSoftmaxSum, kDqAccum, kOne, kLowest };

// ---- the composite backward graph (cuDNN's fused flash-attention backward pattern, as
// cudnn-frontend's sdpa_backward lowers it on Ampere/Hopper): pointwise, reduction,
// matmul and reshape operations that cuDNN's runtime fusion recognises as one kernel.

// One descriptor attribute of an operation (skipped when desc is null: an optional operand).
struct DescAttr {
  cudnnBackendAttributeName_t name;
  cudnnBackendDescriptor_t desc;
  const char* what;
};

// An operation descriptor of `type` with `attrs` set in order, finalized (`what` on failure).
cudnnBackendDescriptor_t operation(Descs& ds, cudnnBackendDescriptorType_t type, std::initializer_list<DescAttr> attrs,
                                   const char* what) {
  auto op = ds.make(type);
  for (const DescAttr& a : attrs)
    if (a.desc) set_desc(op, a.name, a.desc, a.what);
  ok(cudnnBackendFinalize(op), what);
  return op;
}

cudnnBackendDescriptor_t pointwise(Descs& ds, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                                   cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y,
                                   cudnnBackendDescriptor_t t = nullptr, int64_t axis = -1) {
  auto pw = ds.make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
  set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
  if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
  ok(cudnnBackendFinalize(pw), "finalize pointwise descriptor");
  return operation(ds, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
                   {{CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "pointwise op descriptor"},
                    {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x"},
                    {CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise b"},
                    {CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y"},
                    {CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise t"}},
                   "finalize pointwise operation");
}

cudnnBackendDescriptor_t matmul(Descs& ds, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                cudnnBackendDescriptor_t c) {
  auto mm = ds.make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, "matmul compute type");
  ok(cudnnBackendFinalize(mm), "finalize matmul descriptor");
  return operation(ds, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
                   {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul a"},
                    {CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul b"},
                    {CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul c"},
                    {CUDNN_ATTR_OPERATION_MATMUL_DESC, mm, "matmul descriptor"}},
                   "finalize matmul operation");
}

// y = reduce(x) over the axes where y has extent 1 (ADD or MAX, f32 compute).
cudnnBackendDescriptor_t reduce(Descs& ds, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                                cudnnBackendDescriptor_t y) {
  auto rd = ds.make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction operator");
  set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, "reduction compute type");
  ok(cudnnBackendFinalize(rd), "finalize reduction descriptor");
  return operation(ds, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
                   {{CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction x"},
                    {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction y"},
                    {CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd, "reduction descriptor"}},
                   "finalize reduction operation");
}

cudnnBackendDescriptor_t reshape(Descs& ds, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  return operation(
      ds, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
      {{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "reshape x"}, {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "reshape y"}},
      "finalize reshape operation");
}

// The top-left causal mask on the f32 scores x (dims sd, strides sst, [b, h, sq, sk]):
// select(row >= col, x, lowest), the lowest float a by-value input (kLowest). Appends its
// operations to ops; virt(dims, strides, type) makes a virtual tensor. Returns the masked scores.
template <typename Virt>
cudnnBackendDescriptor_t causal_mask(Descs& ds, std::vector<cudnnBackendDescriptor_t>& ops, Virt& virt,
                                     cudnnBackendDescriptor_t x, const int64_t (&sd)[4], const int64_t (&sst)[4]) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, i32 = CUDNN_DATA_INT32, boolean = CUDNN_DATA_BOOLEAN;
  const int64_t one4[4] = {1, 1, 1, 1};
  auto row = virt(sd, sst, i32), col = virt(sd, sst, i32), mask = virt(sd, sst, boolean), y = virt(sd, sst, f32);
  auto lowest = tensor(ds, kLowest, one4, one4, f32, Kind::ByValue);
  ops.push_back(pointwise(ds, CUDNN_POINTWISE_GEN_INDEX, i32, x, nullptr, row, nullptr, 2));
  ops.push_back(pointwise(ds, CUDNN_POINTWISE_GEN_INDEX, i32, x, nullptr, col, nullptr, 3));
  ops.push_back(pointwise(ds, CUDNN_POINTWISE_CMP_GE, boolean, row, col, mask));
  ops.push_back(pointwise(ds, CUDNN_POINTWISE_BINARY_SELECT, f32, x, lowest, y, mask));
  return y;
}

// Makes the virtual tensors of one graph, uids from 100 in the order asked for.
struct Virtuals {
  Descs& ds;
  int64_t uid = 100;
  cudnnBackendDescriptor_t operator()(const int64_t (&dims)[4], const int64_t (&strides)[4],
                                      cudnnDataType_t t = CUDNN_DATA_FLOAT) {
    return tensor(ds, uid++, dims, strides, t, Kind::Virtual);
  }
};

// Dims and strides of the composite graphs' [b, h, s, d] views of the caller's tensors.
struct CompositeDims {
  int64_t qd[4], qst[4];                // Q, O, dO, dQ
  int64_t ktd[4], ktst[4];              // K^T, V^T views
  int64_t kd[4], kst[4];                // K, V, dK, dV
  int64_t rowd[4], rowst[4], lsest[4];  // per-row vectors; the caller's LSE
  int64_t sd[4], sst[4];                // scores
  explicit CompositeDims(const SdpaShape& s) {
    const int64_t b = s.b, hq = s.hq, hk = s.hkv, sq = s.sq, sk = s.sk, d = s.hd;
    const int64_t ls = s.lse_stride > 0 ? s.lse_stride : s.sq;
    auto put = [](int64_t(&x)[4], int64_t x0, int64_t x1, int64_t x2, int64_t x3) {
      x[0] = x0, x[1] = x1, x[2] = x2, x[3] = x3;
    };
    put(qd, b, hq, sq, d), put(qst, sq * hq * d, d, hq * d, 1);
    put(ktd, b, hk, d, sk), put(ktst, sk * hk * d, d, 1, hk * d);
    put(kd, b, hk, sk, d), put(kst, sk * hk * d, d, hk * d, 1);
    put(rowd, b, hq, sq, 1), put(rowst, hq * sq, sq, 1, 1), put(lsest, hq * ls, ls, 1, 1);
    put(sd, b, hq, sq, sk), put(sst, hq * sq * sk, sq * sk, sk, 1);
  }
};

// The operations of the forward of a causal square (cudnn-frontend's composite sdpa with a
// top-left causal mask and a composite softmax emitting Stats, as it lowers them for cuDNN
// before the unified softmax node):
//   S = select(row >= col, scale * Q K^T, lowest);  M = rowmax(S);  E = exp(S - M);
//   Z = rowsum(E);  Stats = M + log Z (the caller's LSE);  O = bf16(E / Z) V.
std::vector<cudnnBackendDescriptor_t> composite_fwd_ops(Descs& ds, const SdpaShape& s) {
  const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  Virtuals virt{ds};
  const CompositeDims g(s);
  const int64_t one4[4] = {1, 1, 1, 1};
  auto q = tensor(ds, kQ, g.qd, g.qst, bf), kt = tensor(ds, kK, g.ktd, g.ktst, bf), v = tensor(ds, kV, g.kd, g.kst, bf);
  auto o = tensor(ds, kO, g.qd, g.qst, bf), stats = tensor(ds, kStats, g.rowd, g.lsest, f32);
  auto scale = tensor(ds, kScale, one4, one4, f32, Kind::ByValue);
  std::vector<cudnnBackendDescriptor_t> ops;
  auto s0 = virt(g.sd, g.sst), s1 = virt(g.sd, g.sst);
  ops.push_back(matmul(ds, q, kt, s0));
  ops.push_back(pointwise(ds, CUDNN_POINTWISE_MUL, f32, s0, scale, s1));
  if (s.causal) s1 = causal_mask(ds, ops, virt, s1, g.sd, g.sst);
  auto mx = virt(g.rowd, g.rowst), sub = virt(g.sd, g.sst), e = virt(g.sd, g.sst), z = virt(g.rowd, g.rowst),
       lz = virt(g.rowd, g.rowst);
  ops.push_back(reduce(ds, CUDNN_REDUCE_TENSOR_MAX, s1, mx));
  ops.push_back(pointwise(ds, CUDNN_POINTWISE_SUB, f32, s1, mx, sub));
  ops.push_back(pointwise(ds, CUDNN_POINTWISE_EXP, f32, sub, nullptr, e));
  ops.push_back(reduce(ds, CUDNN_REDUCE_TENSOR_ADD, e, z));
  ops.push_back(pointwise(ds, CUDNN_POINTWISE_LOG, f32, z, nullptr, lz));
  ops.push_back(pointwise(ds, CUDNN_POINTWISE_ADD, f32, mx, lz, stats));
  auto p = virt(g.sd, g.sst, bf);  // the second matmul takes P in the I/O type
  ops.push_back(pointwise(ds, CUDNN_POINTWISE_DIV, f32, e, z, p));
  ops.push_back(matmul(ds, p, v, o));
  return ops;
}

// out = a b for dK / dV: with GQA per query head into a virtual bf16 [b, hq, sk, d], then summed
// over each kv head's group.
void grouped_matmul(Descs& ds, std::vector<cudnnBackendDescriptor_t>& ops, Virtuals& virt, const SdpaShape& s,
                    cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t out) {
  if (s.hq == s.hkv) {
    ops.push_back(matmul(ds, a, b, out));
    return;
  }
  const int64_t fd[4] = {s.b, s.hq, s.sk, s.hd}, fst[4] = {s.hq * s.sk * s.hd, s.sk * s.hd, s.hd, 1};
  auto per_head = virt(fd, fst, CUDNN_DATA_BFLOAT16);
  ops.push_back(matmul(ds, a, b, per_head));
  ops.push_back(reduce(ds, CUDNN_REDUCE_TENSOR_ADD, per_head, out));
}

// The operations of the backward of one block (dims as the caller's [b, h, s, d] views):
//   D = rowsum(dO * O)                      -> softmax_sum (f32 workspace)
//   P = exp(scale * Q K^T [masked] - LSE)    (virtual; LSE = the caller's Stats)
//   dV = P^T dO;  dS = P * (dO V^T - D) * scale;  dK = dS^T Q;  dQ = dS K (f32 dQ_accum -> dQ)
// GQA: dK/dV per query head (virtual bf16), then summed over each kv head's group.
std::vector<cudnnBackendDescriptor_t> composite_bwd_ops(Descs& ds, const SdpaShape& s) {
  const int64_t b = s.b, hq = s.hq, sq = s.sq, sk = s.sk, d = s.hd;
  const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  Virtuals virt{ds};
  const CompositeDims g(s);
  const int64_t one4[4] = {1, 1, 1, 1};
  const int64_t td[4] = {b, hq, sk, sq}, tst[4] = {hq * sq * sk, sq * sk, 1, sk};  // transposed scores
  const int64_t accst[4] = {hq * sq * d, sq * d, d, 1};
  const int64_t dood[4] = {b, hq, sq, d}, doost[4] = {hq * sq * d, sq * d, hq * d, 1};

  auto q = tensor(ds, kQ, g.qd, g.qst, bf), kt = tensor(ds, kK, g.ktd, g.ktst, bf),
       vt = tensor(ds, kV, g.ktd, g.ktst, bf);
  auto o = tensor(ds, kO, g.qd, g.qst, bf), dout = tensor(ds, kDO, g.qd, g.qst, bf);
  auto stats = tensor(ds, kStats, g.rowd, g.lsest, f32);
  auto dq = tensor(ds, kDQ, g.qd, g.qst, bf), dk = tensor(ds, kDK, g.kd, g.kst, bf),
       dv = tensor(ds, kDV, g.kd, g.kst, bf);
  auto scale = tensor(ds, kScale, one4, one4, f32, Kind::ByValue);
  auto one = tensor(ds, kOne, one4, one4, f32, Kind::ByValue);
  auto sum = tensor(ds, kSoftmaxSum, g.rowd, g.rowst, f32);

  std::vector<cudnnBackendDescriptor_t> ops;
  // D = rowsum(dO * O)
  auto doo = virt(dood, doost);
  ops.push_back(pointwise(ds, CUDNN_POINTWISE_MUL, f32, dout, o, doo));
  auto red = virt(g.rowd, g.rowst);
  ops.push_back(reduce(ds, CUDNN_REDUCE_TENSOR_ADD, doo, red));
  ops.push_back(pointwise(ds, CUDNN_POINTWISE_MUL, f32, red, one, sum));
  // P = exp(scale * Q K^T - LSE), causal: select(row >= col, ., lowest)
  auto s0 = virt(g.sd, g.sst), s1 = virt(g.sd, g.sst), s2 = virt(g.sd, g.sst);
  ops.push_back(matmul(ds, q, kt, s0));
  ops.push_back(pointwise(ds, CUDNN_POINTWISE_MUL, f32, s0, scale, s1));
  ops.push_back(pointwise(ds, CUDNN_POINTWISE_SUB, f32, s1, stats, s2));
  if (s.causal) s2 = causal_mask(ds, ops, virt, s2, g.sd, g.sst);
  auto p = virt(g.sd, g.sst);
  ops.push_back(pointwise(ds, CUDNN_POINTWISE_EXP, f32, s2, nullptr, p));
  // dV = P^T dO (summed over each group of query heads with GQA)
  auto pt = virt(td, tst, bf);
  ops.push_back(reshape(ds, p, pt));
  grouped_matmul(ds, ops, virt, s, pt, dout, dv);
  // dS = P * (dO V^T - D) * scale
  auto dp = virt(g.sd, g.sst), dp1 = virt(g.sd, g.sst), ds0 = virt(g.sd, g.sst), dsc = virt(g.sd, g.sst);
  ops.push_back(matmul(ds, dout, vt, dp));
  ops.push_back(pointwise(ds, CUDNN_POINTWISE_SUB, f32, dp, sum, dp1));
  ops.push_back(pointwise(ds, CUDNN_POINTWISE_MUL, f32, dp1, p, ds0));
  ops.push_back(pointwise(ds, CUDNN_POINTWISE_MUL, f32, ds0, scale, dsc));
  // dK = dS^T Q
  auto dst = virt(td, tst, bf);
  ops.push_back(reshape(ds, dsc, dst));
  grouped_matmul(ds, ops, virt, s, dst, q, dk);
  // dQ = dS K: deterministic straight into dQ (cuDNN keeps dP in its workspace), else
  // accumulated atomically by cuDNN in f32 over key tiles, then cast
  auto k = virt(g.kd, g.kst, bf);
  ops.push_back(reshape(ds, kt, k));
  if (s.deterministic) {
    ops.push_back(matmul(ds, dsc, k, dq));
  } else {
    auto acc = tensor(ds, kDqAccum, g.qd, accst, f32);
    ops.push_back(matmul(ds, dsc, k, acc));
    ops.push_back(pointwise(ds, CUDNN_POINTWISE_IDENTITY, f32, acc, nullptr, dq));
  }
  return ops;
}

}  // namespace

struct CudnnAttention::Plan {
  Descs descs;
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace = 0;  // cuDNN's own, then (composite backward) softmax_sum and dQ_accum
  bool composite = false;
  int64_t sum_offset = 0, acc_offset = 0, total = 0;  // bytes into the workspace
};

CudnnAttention::CudnnAttention() {
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t s = cudnnCreate(&h);
  EASYCTX_CHECK(s == CUDNN_STATUS_SUCCESS, process_label(), " cudnnCreate failed: ", cudnnGetErrorString(s));
  handle_ = h;
}

CudnnAttention::~CudnnAttention() {
  plans_.clear();
  if (ws_) cudaFree(ws_);
  if (handle_) cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

void* CudnnAttention::workspace(size_t bytes, cudaStream_t st) {
  if (bytes <= ws_bytes_) return ws_;
  EASYCTX_CUDA_CHECK(cudaStreamSynchronize(st));  // the old workspace may still be in use
  if (ws_) EASYCTX_CUDA_CHECK(cudaFree(ws_));
  ws_ = nullptr;
  EASYCTX_CUDA_CHECK(cudaMalloc(&ws_, bytes));
  ws_bytes_ = bytes;
  return ws_;
}

namespace {
// An execution plan for `ops` from the heuristics' first engine configuration that
// finalises; throws Decline when none does.
cudnnBackendDescriptor_t make_plan(Descs& ds, cudnnHandle_t handle, const std::vector<cudnnBackendDescriptor_t>& ops,
                                   int64_t* workspace) {
  auto graph = ds.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
  set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops.size()), ops.data(),
      "graph ops");
  ok(cudnnBackendFinalize(graph), "finalize operation graph");
  auto heur = ds.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristic graph");
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristic mode");
  ok(cudnnBackendFinalize(heur), "finalize heuristic");
  int64_t count = 0;
  ok(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
     "heuristic result count");
  if (count <= 0) throw Decline{"the heuristic returned no engine configuration"};
  std::vector<cudnnBackendDescriptor_t> cfgs(static_cast<size_t>(count));
  for (auto& c : cfgs) c = ds.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  int64_t got = 0;
  ok(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                              cfgs.data()),
     "heuristic results");
  std::string why = "no engine configuration finalised";
  for (int64_t i = 0; i < got; ++i) {
    cudnnBackendDescriptor_t pl = ds.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    try {
      set(pl, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "plan handle");
      set_desc(pl, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[static_cast<size_t>(i)], "plan engine config");
      ok(cudnnBackendFinalize(pl), "finalize execution plan");
      int64_t n = 0;
      ok(cudnnBackendGetAttribute(pl, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, workspace),
         "plan workspace size");
      return pl;
    } catch (const Decline& d) { why = d.what; }
  }
  throw Decline{why};
}

int64_t align256(int64_t x) { return (x + 255) / 256 * 256; }
}  // namespace

CudnnAttention::Plan* CudnnAttention::plan(bool bwd, const SdpaShape& s) {
  const auto key = std::tuple_cat(std::make_tuple(bwd), s.key());
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();  // nullptr: declined before
  auto p = std::make_unique<Plan>();
  cudnnHandle_t handle = static_cast<cudnnHandle_t>(handle_);
  std::string composite_why;
  if (!bwd && s.causal) {  // the single-operation forward has no mask: the composite graph
    try {
      p->plan = make_plan(p->descs, handle, composite_fwd_ops(p->descs, s), &p->workspace);
      p->composite = true;
      p->total = p->workspace;
      return (plans_[key] = std::move(p)).get();
    } catch (const Decline& d) {
      composite_why = "composite graph: " + d.what + "; ";
      p = std::make_unique<Plan>();
    }
  }
  if (bwd) {  // the composite graph first (Ampere, Hopper; cuDNN's SDPA_BWD node is Blackwell-only in 9.19)
    try {
      p->plan = make_plan(p->descs, handle, composite_bwd_ops(p->descs, s), &p->workspace);
      p->composite = true;
      p->sum_offset = align256(p->workspace);
      p->acc_offset = p->sum_offset + align256(4 * s.b * s.hq * s.sq);
      p->total = p->acc_offset + (s.deterministic ? 0 : 4 * s.b * s.hq * s.sq * s.hd);
      return (plans_[key] = std::move(p)).get();
    } catch (const Decline& d) {
      composite_why = "composite graph: " + d.what + "; ";
      p = std::make_unique<Plan>();
    }
  }
  try {
    if (s.causal) throw Decline{"the single-operation node has no causal mask in cuDNN 9.19"};
    if (bwd && s.deterministic) throw Decline{"the single-operation node is not deterministic"};
    if (s.lse_stride > 0 && s.lse_stride != s.sq) throw Decline{"strided LSE rows"};
    Descs& ds = p->descs;
    // [b, h, s, d] views of the [B, S, H, hd] buffers; stats [b, h, s, 1] of f32[B, H, S].
    const int64_t qd[4] = {s.b, s.hq, s.sq, s.hd}, qs[4] = {s.sq * s.hq * s.hd, s.hd, s.hq * s.hd, 1};
    const int64_t kd[4] = {s.b, s.hkv, s.sk, s.hd}, ks[4] = {s.sk * s.hkv * s.hd, s.hd, s.hkv * s.hd, 1};
    const int64_t ld[4] = {s.b, s.hq, s.sq, 1}, ls[4] = {s.hq * s.sq, s.sq, 1, 1};
    const int64_t one[4] = {1, 1, 1, 1};
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
    auto q = tensor(ds, kQ, qd, qs, bf), k = tensor(ds, kK, kd, ks, bf), v = tensor(ds, kV, kd, ks, bf);
    auto o = tensor(ds, kO, qd, qs, bf), stats = tensor(ds, kStats, ld, ls, f32);
    auto scale = tensor(ds, kScale, one, one, f32, Kind::ByValue);
    cudnnBackendDescriptor_t op;
    if (!bwd) {
      op = ds.make(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR);
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, q, "sdpa fwd q");
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, k, "sdpa fwd k");
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, v, "sdpa fwd v");
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, o, "sdpa fwd o");
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, stats, "sdpa fwd stats");
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, scale, "sdpa fwd scale");
    } else {
      auto dout = tensor(ds, kDO, qd, qs, bf), dq = tensor(ds, kDQ, qd, qs, bf);
      auto dk = tensor(ds, kDK, kd, ks, bf), dv = tensor(ds, kDV, kd, ks, bf);
      op = ds.make(CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR);
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_QDESC, q, "sdpa bwd q");
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_KDESC, k, "sdpa bwd k");
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_VDESC, v, "sdpa bwd v");
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_ODESC, o, "sdpa bwd o");
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_STATSDESC, stats, "sdpa bwd stats");
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_SCALEDESC, scale, "sdpa bwd scale");
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DODDESC, dout, "sdpa bwd dO");
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DQDESC, dq, "sdpa bwd dQ");
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DKDESC, dk, "sdpa bwd dK");
      set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DVDESC, dv, "sdpa bwd dV");
    }
    ok(cudnnBackendFinalize(op), bwd ? "finalize SDPA_BWD" : "finalize SDPA_FWD");
    p->plan = make_plan(ds, handle, {op}, &p->workspace);
    p->total = p->workspace;
  } catch (const Decline& d) {
    last_decline_ = bwd ? "SDPA backward: " + composite_why + "SDPA_BWD: " + d.what
                        : "SDPA forward: " + composite_why + "SDPA_FWD: " + d.what;
    plans_[key] = nullptr;
    return nullptr;
  }
  return (plans_[key] = std::move(p)).get();
}

namespace {
void execute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& ptrs, void* ws, cudaStream_t st) {
  const cudnnStatus_t ss = cudnnSetStream(h, st);
  EASYCTX_CHECK(ss == CUDNN_STATUS_SUCCESS, process_label(), " cudnnSetStream: ", cudnnGetErrorString(ss));
  cudnnBackendDescriptor_t vp = nullptr;
  cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
  if (s == CUDNN_STATUS_SUCCESS)
    s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                 static_cast<int64_t>(uids.size()), uids.data());
  if (s == CUDNN_STATUS_SUCCESS)
    s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                 static_cast<int64_t>(ptrs.size()), ptrs.data());
  if (s == CUDNN_STATUS_SUCCESS)
    s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(vp);
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendExecute(h, plan, vp);
  if (vp) cudnnBackendDestroyDescriptor(vp);
  if (s != CUDNN_STATUS_SUCCESS) {
    char detail[512] = {0};
    cudnnGetLastErrorString(detail, sizeof(detail));
    EASYCTX_THROW(process_label(), " cuDNN SDPA execution failed: ", cudnnGetErrorString(s), " ", detail);
  }
}
}  // namespace

bool CudnnAttention::try_fwd(const SdpaShape& s, float scale, const void* q, const void* k, const void* v, void* o,
                             float* lse, cudaStream_t st) {
  Plan* p = plan(false, s);
  if (!p) return false;
  void* ws = workspace(static_cast<size_t>(p->total), st);
  float lowest = std::numeric_limits<float>::lowest();
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> ptrs = {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), o, lse, &scale};
  if (p->composite && s.causal) {
    uids.push_back(kLowest);
    ptrs.push_back(&lowest);
  }
  execute(static_cast<cudnnHandle_t>(handle_), p->plan, uids, ptrs, ws, st);
  return true;
}

bool CudnnAttention::has_bwd_plan(const SdpaShape& s) { return plan(true, s) != nullptr; }
bool CudnnAttention::has_fwd_plan(const SdpaShape& s) { return plan(false, s) != nullptr; }

bool CudnnAttention::try_bwd(const SdpaShape& s, float scale, const void* q, const void* k, const void* v,
                             const void* o, const float* lse, const void* dout, void* dq, void* dk, void* dv,
                             cudaStream_t st) {
  Plan* p = plan(true, s);
  if (!p) return false;
  char* ws = static_cast<char*>(workspace(static_cast<size_t>(p->total), st));
  const std::vector<void*> io = {const_cast<void*>(q),
                                 const_cast<void*>(k),
                                 const_cast<void*>(v),
                                 const_cast<void*>(o),
                                 const_cast<float*>(lse),
                                 &scale,
                                 const_cast<void*>(dout),
                                 dq,
                                 dk,
                                 dv};
  if (!p->composite) {
    execute(static_cast<cudnnHandle_t>(handle_), p->plan, {kQ, kK, kV, kO, kStats, kScale, kDO, kDQ, kDK, kDV}, io, ws,
            st);
    return true;
  }
  float one = 1.f, lowest = std::numeric_limits<float>::lowest();
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale, kDO, kDQ, kDK, kDV, kSoftmaxSum, kOne};
  std::vector<void*> ptrs = io;
  ptrs.push_back(ws + p->sum_offset);
  ptrs.push_back(&one);
  if (!s.deterministic) {
    void* acc = ws + p->acc_offset;
    // dQ_accum is accumulated into (atomically, across key tiles): it starts at zero.
    EASYCTX_CUDA_CHECK(cudaMemsetAsync(acc, 0, static_cast<size_t>(p->total - p->acc_offset), st));
    uids.push_back(kDqAccum);
    ptrs.push_back(acc);
  }
  if (s.causal) {
    uids.push_back(kLowest);
    ptrs.push_back(&lowest);
  }
  execute(static_cast<cudnnHandle_t>(handle_), p->plan, uids, ptrs, ws, st);
  return true;
}

#else  // cuDNN older than 9.19: no single-op SDPA nodes; every block runs on our kernels.

struct CudnnAttention::Plan {};
CudnnAttention::CudnnAttention() = default;
CudnnAttention::~CudnnAttention() = default;
bool CudnnAttention::has_bwd_plan(const SdpaShape&) {
  last_decline_ = "cuDNN < 9.19 at build time";
  return false;
}
bool CudnnAttention::has_fwd_plan(const SdpaShape&) {
  last_decline_ = "cuDNN < 9.19 at build time";
  return false;
}
bool CudnnAttention::try_fwd(const SdpaShape&, float, const void*, const void*, const void*, void*, float*,
                             cudaStream_t) {
  last_decline_ = "cuDNN < 9.19 at build time";
  return false;
}
bool CudnnAttention::try_bwd(const SdpaShape&, float, const void*, const void*, const void*, const void*, const float*,
                             const void*, void*, void*, void*, cudaStream_t) {
  last_decline_ = "cuDNN < 9.19 at build time";
  return false;
}

#endif

}  // namespace easyctx::ops::cuda
