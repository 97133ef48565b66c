// cuBLASLt, loaded on first use (dlopen) instead of linked: loading libcublasLt (~540 MB, its
// kernel tables set up by its constructors) takes ~0.4 s of every process that links it, and
// most processes that link easyctx never run a matmul on a GPU (the CPU backend, the CLIs'
// flag and plan checks, the data tools, every CPU test case). cublaslt() opens
// EASYCTX_CUBLASLT_SONAME (the toolkit's soname, e.g. libcublasLt.so.13) through the dynamic
// loader's search (LD_LIBRARY_PATH, ld.so.cache), then in the toolkit's library folder of the
// build (EASYCTX_CUBLASLT_DIR), and throws naming both and dlerror() when neither loads or a
// symbol is missing. The types and constants still come from <cublasLt.h>.
#pragma once
#include <cublasLt.h>

namespace easyctx::ops::cuda {

struct CublasLtApi {
  decltype(&::cublasLtCreate) create;
  decltype(&::cublasLtDestroy) destroy;
  decltype(&::cublasLtGetStatusName) status_name;
  decltype(&::cublasLtGetStatusString) status_string;
  decltype(&::cublasLtMatmul) matmul;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) algo_get_heuristic;
  decltype(&::cublasLtMatmulDescCreate) desc_create;
  decltype(&::cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&::cublasLtMatmulDescSetAttribute) desc_set_attribute;
  decltype(&::cublasLtMatmulPreferenceCreate) preference_create;
  decltype(&::cublasLtMatmulPreferenceDestroy) preference_destroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) preference_set_attribute;
  decltype(&::cublasLtMatrixLayoutCreate) layout_create;
  decltype(&::cublasLtMatrixLayoutDestroy) layout_destroy;
};

// The library's entry points, loaded once (thread-safe); throws easyctx::Error when it cannot.
const CublasLtApi& cublaslt();

}  // namespace easyctx::ops::cuda
