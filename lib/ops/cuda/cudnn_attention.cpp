#include "ops/cuda/cudnn_attention.h"

#include <cudnn.h>

#include <vector>

#include "cuda_check.h"

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
  throw Decline{std::string(what) + ": " + cudnnGetErrorString(s) + (detail[0] ? std::string(" (") + detail + ")" : "")};
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
cudnnBackendDescriptor_t tensor(Descs& ds, int64_t uid, const int64_t (&dims)[4], const int64_t (&strides)[4],
                                cudnnDataType_t type, bool by_value = false) {
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
  ok(cudnnBackendFinalize(t), "finalize tensor");
  return t;
}

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kDO, kDQ, kDK, kDV };

}  // namespace

struct CudnnAttention::Plan {
  Descs descs;
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace = 0;
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

CudnnAttention::Plan* CudnnAttention::plan(bool bwd, const SdpaShape& s) {
  const auto key = std::tuple_cat(std::make_tuple(bwd), s.key());
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();  // nullptr: declined before
  auto p = std::make_unique<Plan>();
  try {
    Descs& ds = p->descs;
    cudnnHandle_t handle = static_cast<cudnnHandle_t>(handle_);
    // [b, h, s, d] views of the [B, S, H, hd] buffers; stats [b, h, s, 1] of f32[B, H, S].
    const int64_t qd[4] = {s.b, s.hq, s.sq, s.hd}, qs[4] = {s.sq * s.hq * s.hd, s.hd, s.hq * s.hd, 1};
    const int64_t kd[4] = {s.b, s.hkv, s.sk, s.hd}, ks[4] = {s.sk * s.hkv * s.hd, s.hd, s.hkv * s.hd, 1};
    const int64_t ld[4] = {s.b, s.hq, s.sq, 1}, ls[4] = {s.hq * s.sq, s.sq, 1, 1};
    const int64_t one[4] = {1, 1, 1, 1};
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
    auto q = tensor(ds, kQ, qd, qs, bf), k = tensor(ds, kK, kd, ks, bf), v = tensor(ds, kV, kd, ks, bf);
    auto o = tensor(ds, kO, qd, qs, bf), stats = tensor(ds, kStats, ld, ls, f32);
    auto scale = tensor(ds, kScale, one, one, f32, true);
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
    auto graph = ds.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
    set_desc(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, op, "graph ops");
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
    for (int64_t i = 0; i < got && !p->plan; ++i) {
      cudnnBackendDescriptor_t pl = ds.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      try {
        set(pl, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "plan handle");
        set_desc(pl, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[static_cast<size_t>(i)], "plan engine config");
        ok(cudnnBackendFinalize(pl), "finalize execution plan");
        p->plan = pl;
      } catch (const Decline& d) {
        why = d.what;
      }
    }
    if (!p->plan) throw Decline{why};
    ok(cudnnBackendGetAttribute(p->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &count,
                                &p->workspace),
       "plan workspace size");
  } catch (const Decline& d) {
    last_decline_ = std::string(bwd ? "SDPA_BWD" : "SDPA_FWD") + ": " + d.what;
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
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
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
  void* ws = workspace(static_cast<size_t>(p->workspace), st);
  execute(static_cast<cudnnHandle_t>(handle_), p->plan, {kQ, kK, kV, kO, kStats, kScale},
          {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), o, lse, &scale}, ws, st);
  return true;
}

bool CudnnAttention::has_bwd_plan(const SdpaShape& s) { return plan(true, s) != nullptr; }
bool CudnnAttention::has_fwd_plan(const SdpaShape& s) { return plan(false, s) != nullptr; }

bool CudnnAttention::try_bwd(const SdpaShape& s, float scale, const void* q, const void* k, const void* v,
                             const void* o, const float* lse, const void* dout, void* dq, void* dk, void* dv,
                             cudaStream_t st) {
  Plan* p = plan(true, s);
  if (!p) return false;
  void* ws = workspace(static_cast<size_t>(p->workspace), st);
  execute(static_cast<cudnnHandle_t>(handle_), p->plan, {kQ, kK, kV, kO, kStats, kScale, kDO, kDQ, kDK, kDV},
          {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), const_cast<void*>(o),
           const_cast<float*>(lse), &scale, const_cast<void*>(dout), dq, dk, dv},
          ws, st);
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
bool CudnnAttention::try_bwd(const SdpaShape&, float, const void*, const void*, const void*, const void*,
                             const float*, const void*, void*, void*, void*, cudaStream_t) {
  last_decline_ = "cuDNN < 9.19 at build time";
  return false;
}

#endif

}  // namespace easyctx::ops::cuda
