// train.recompute: activation recomputation (model/gpt.h). none keeps every block's record; selective drops the
// attention probabilities [B, NH, T, T] (the largest record) and recomputes them before the attention backward;
// full keeps only each block's input and recomputes the block's forward inside its backward. The recomputed
// values are the kept ones bit for bit (the same kernels on the same inputs), so losses and gradients do not move.
#pragma once
#include <cstdint>

#include "core/enum_names.h"

namespace mt {

enum class Recompute : uint8_t { None, Selective, Full };
inline const auto& enum_names(Recompute) {
  static constexpr EnumName<Recompute> names[] = {
      {Recompute::None, "none"}, {Recompute::Selective, "selective"}, {Recompute::Full, "full"}};
  return names;
}

}  // namespace mt
