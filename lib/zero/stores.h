// Internal to lib/zero: the two ParamStore implementations (make_param_store picks one).
#pragma once
#include <memory>

#include "zero/param_store.h"

namespace easyctx::zero {

std::unique_ptr<ParamStore> make_replicated_store(const model::ParamLayout& layout, ops::Backend& be, DType dtype,
                                                  const StoreOptions& o, const StoreComms& c);
std::unique_ptr<ParamStore> make_sharded_store(const model::ParamLayout& layout, ops::Backend& be, DType dtype,
                                               const StoreOptions& o, const StoreComms& c);

}  // namespace easyctx::zero
