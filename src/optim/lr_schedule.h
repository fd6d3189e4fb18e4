// Learning-rate schedules. Step s counts from 1. Warmup is linear: lr(s) = lr * s / warmup for s <= warmup.
// After it, with progress p = (s - warmup) / (steps - warmup) in [0, 1]:
//   cosine:   min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi p))
//   linear:   lr - (lr - min_lr) * p
//   constant: lr
#pragma once
#include <cstdint>

#include "core/enum_names.h"

namespace mt {

// The decay after warm-up (optim.schedule).
enum class LRDecay : uint8_t { Cosine, Linear, Constant };
inline const auto& enum_names(LRDecay) {
  static constexpr EnumName<LRDecay> names[] = {
      {LRDecay::Cosine, "cosine"}, {LRDecay::Linear, "linear"}, {LRDecay::Constant, "constant"}};
  return names;
}

struct LRSchedule {
  LRDecay kind = LRDecay::Cosine;
  double lr = 1e-3, min_lr = 0;
  int warmup_steps = 0, total_steps = 1;
  double at(int step) const;
};

}  // namespace mt
