// GPU GELU, tanh approximation (kernels/gelu.h): declarations only, without CUDA headers, so every build can
// include them. The entry points in kernels/gelu.cpp check the arguments.
#pragma once
#include "core/tensor.h"

namespace mt::kernels::gpu {

void gelu_forward(const Tensor& out, const Tensor& inp);                        // out overwritten
void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout);  // dinp overwritten (may alias dout)

}  // namespace mt::kernels::gpu
