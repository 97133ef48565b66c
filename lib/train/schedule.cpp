#include "train/schedule.h"

#include <algorithm>
#include <cmath>

namespace easyctx::train {

double lr_at(const TrainConfig& c, int64_t step) {
  if (c.warmup_steps > 0 && step < c.warmup_steps)
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  if (c.schedule == LrSchedule::Constant) return c.lr;
  const int64_t span = std::max<int64_t>(1, c.steps - c.warmup_steps);
  // progress 0 at the first post-warmup step, 1 at the last step.
  const double p = std::clamp(
      static_cast<double>(step - c.warmup_steps) / static_cast<double>(std::max<int64_t>(1, span - 1)), 0.0, 1.0);
  if (c.schedule == LrSchedule::Linear) return c.min_lr + (c.lr - c.min_lr) * (1.0 - p);
  return c.min_lr + (c.lr - c.min_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
}

}  // namespace easyctx::train
