// Elementwise ops over tensors of equal numel: the residual add and gradient accumulation.
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

void add_forward(const Tensor& out, const Tensor& a, const Tensor& b);  // out = a + b (may alias a or b)
void accumulate(const Tensor& dst, const Tensor& src);                   // dst += src
// out[N, OC] += bias[OC] (row-parallel layers add their replicated bias after the tp all-reduce)
void bias_add(const Tensor& out, const Tensor& bias);

}  // namespace mt::kernels
