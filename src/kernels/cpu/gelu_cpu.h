// CPU GELU (tanh approximation), see kernels/gelu.h.
#pragma once
#include <cstdint>

namespace mt::kernels::cpu {

template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n);
// dinp may alias dout.
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n);

}  // namespace mt::kernels::cpu
