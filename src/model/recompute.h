// train.recompute: activation recomputation (model/gpt.h). none keeps every block's record; light drops the norms'
// outputs and the MLP's activation and recomputes them (elementwise, no matmul) at the start of the block's
// backward; selective drops the attention probabilities [B, NH, T, T] and recomputes them before the attention
// backward; full keeps only each block's input and recomputes the block's forward inside its backward. Under
// light and selective one buffer per record serves every block. The recomputed values are the kept ones bit for
// bit (the same kernels on the same inputs), so losses and gradients do not move. Light comes last so that the
// planner's calibration cache keeps its numbers for the others.
#pragma once
#include <cstdint>

#include "core/enum_names.h"

namespace mt {

enum class Recompute : uint8_t { None, Selective, Full, Light };
inline const auto& enum_names(Recompute) {
  static constexpr EnumName<Recompute> names[] = {
      {Recompute::None, "none"},
      {Recompute::Light, "light"},
      {Recompute::Selective, "selective"},
      {Recompute::Full, "full"}};
  return names;
}

}  // namespace mt
