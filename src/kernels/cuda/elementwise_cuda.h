// GPU elementwise ops (kernels/elementwise.h): declarations only, without CUDA headers, so every build can include
// them. The entry points in kernels/elementwise.cpp check the arguments.
#pragma once
#include "core/tensor.h"

namespace mt::kernels::gpu {

void add_forward(const Tensor& out, const Tensor& a, const Tensor& b);  // out = a + b (may alias a or b)
void accumulate(const Tensor& dst, const Tensor& src);                  // dst += src, any two float dtypes
void bias_add(const Tensor& out, const Tensor& bias);                   // out[N, OC] += bias[OC]
void divide_(const Tensor& t, int divisor);                             // t /= divisor (fp32, bf16, fp16)

}  // namespace mt::kernels::gpu
