// GPU SwiGLU (kernels/swiglu.h): declarations only, without CUDA headers, so every build can include them. The
// entry points in kernels/swiglu.cpp check the arguments.
#pragma once
#include "core/tensor.h"

namespace mt::kernels::gpu {

void swiglu_forward(const Tensor& out, const Tensor& inp);                        // out overwritten
void swiglu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp);  // dinp overwritten

}  // namespace mt::kernels::gpu
