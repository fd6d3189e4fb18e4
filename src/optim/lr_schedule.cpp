// Learning-rate schedule evaluation (formulas in the header; the PyTorch parity test repeats them).
#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace mt {

double LRSchedule::at(int step) const {
  if (warmup_steps > 0 && step <= warmup_steps) return lr * step / warmup_steps;
  if (kind == LRDecay::Constant || total_steps <= warmup_steps) return lr;
  double p = std::clamp(double(step - warmup_steps) / double(total_steps - warmup_steps), 0.0, 1.0);
  if (kind == LRDecay::Cosine) return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
  if (kind == LRDecay::Linear) return lr - (lr - min_lr) * p;
  CHECK(false, "unknown lr schedule {}", static_cast<int>(kind));
}

}  // namespace mt
