// Learning-rate schedules (train.schedule): constant, linear or cosine decay to train.min_lr,
// each after a linear warmup of train.warmup_steps steps from lr/warmup to lr.
#pragma once
#include <cstdint>

#include "core/config.h"

namespace easyctx::train {

// LR of optimizer step `step` (0-based) of a run of cfg.steps steps.
double lr_at(const TrainConfig& cfg, int64_t step);

}  // namespace easyctx::train
