// GELU, tanh approximation (GPT-2's): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// All arguments share one dtype (fp32, fp64, bf16 or fp16); 16-bit values are computed in fp32 and each output
// element is rounded once.
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

void gelu_forward(const Tensor& out, const Tensor& inp);                        // out overwritten
void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout);  // dinp overwritten (may alias dout)

}  // namespace mt::kernels
