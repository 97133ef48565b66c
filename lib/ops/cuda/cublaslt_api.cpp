#include "ops/cuda/cublaslt_api.h"

#include <dlfcn.h>

#include <string>
#include <type_traits>

#include "core/error.h"

namespace easyctx::ops::cuda {
namespace {

CublasLtApi load() {
  const std::string soname = EASYCTX_CUBLASLT_SONAME, in_dir = std::string(EASYCTX_CUBLASLT_DIR) + "/" + soname;
  void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string why;
  if (!h) {
    why = dlerror();
    h = dlopen(in_dir.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (!h)
    EASYCTX_THROW("cuBLASLt: cannot load ", soname, " (", why, ") nor ", in_dir, " (", dlerror(),
                  "): put the CUDA toolkit's library folder on LD_LIBRARY_PATH");
  // never dlclose'd: the process keeps the library as it would a linked one
  auto sym = [&](auto& fn, const char* name) {
    dlerror();
    void* p = dlsym(h, name);
    if (!p) EASYCTX_THROW("cuBLASLt: ", soname, " has no ", name, " (", dlerror(), ")");
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  CublasLtApi a{};
  sym(a.create, "cublasLtCreate");
  sym(a.destroy, "cublasLtDestroy");
  sym(a.status_name, "cublasLtGetStatusName");
  sym(a.status_string, "cublasLtGetStatusString");
  sym(a.matmul, "cublasLtMatmul");
  sym(a.algo_get_heuristic, "cublasLtMatmulAlgoGetHeuristic");
  sym(a.desc_create, "cublasLtMatmulDescCreate");
  sym(a.desc_destroy, "cublasLtMatmulDescDestroy");
  sym(a.desc_set_attribute, "cublasLtMatmulDescSetAttribute");
  sym(a.preference_create, "cublasLtMatmulPreferenceCreate");
  sym(a.preference_destroy, "cublasLtMatmulPreferenceDestroy");
  sym(a.preference_set_attribute, "cublasLtMatmulPreferenceSetAttribute");
  sym(a.layout_create, "cublasLtMatrixLayoutCreate");
  sym(a.layout_destroy, "cublasLtMatrixLayoutDestroy");
  return a;
}

}  // namespace

const CublasLtApi& cublaslt() {
  static const CublasLtApi api = load();  // a throw leaves it unset: the next call tries again
  return api;
}

}  // namespace easyctx::ops::cuda
