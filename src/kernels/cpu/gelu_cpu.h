// CPU GELU (tanh approximation), see kernels/gelu.h. S is the storage type (float, double, bf16, fp16).
#pragma once
#include <cstdint>

#include "kernels/cpu/storage.h"

namespace mt::kernels::cpu {

template <typename S>
void gelu_forward(S* out, const S* inp, int64_t n);
// dinp may alias dout.
template <typename S>
void gelu_backward(S* dinp, const S* inp, const S* dout, int64_t n);

}  // namespace mt::kernels::cpu
