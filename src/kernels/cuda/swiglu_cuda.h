// GPU SwiGLU (kernels/swiglu.h): declarations only, without CUDA headers, so every build can include them. The
// entry points in kernels/swiglu.cpp check the arguments (shapes, and which tensors may alias).
#pragma once
#include "core/tensor.h"

namespace mt::kernels::gpu {

void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up);  // out overwritten
void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up);  // dgate, dup overwritten

}  // namespace mt::kernels::gpu
