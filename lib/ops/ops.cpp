#include "ops/ops.h"

namespace easyctx::ops {

// Synchronous backends: every op has run when it returns.
Queue& Backend::queue() {
  static HostQueue host;
  return host;
}

std::unique_ptr<Queue> Backend::make_queue(bool /*high_priority*/) { return std::make_unique<HostQueue>(); }

std::string Backend::attention_route(const AttentionCall& /*call*/, bool /*backward*/) const { return {}; }

void Backend::lm_head_score(const Tensor&, const Tensor&, const Tensor&, int64_t, const Tensor&, const Tensor&) {
  EASYCTX_THROW("lm_head_score: the ", name(), " backend does not implement it");
}

}  // namespace easyctx::ops
