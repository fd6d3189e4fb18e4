// GPU LayerNorm (kernels/layernorm.h): declarations only, without CUDA headers, so every build can include them.
// The public entry points in kernels/layernorm.cpp check the arguments; these assume checked tensors on the GPU.
#pragma once
#include "core/tensor.h"

namespace mt::kernels::gpu {

// out = LayerNorm(inp); mean, rstd overwritten.
void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias, double eps);
// residual_out = a + b (rounded once; may alias a or b), then ln_out = LayerNorm(residual_out) from the rounded
// residual, in one kernel that reads a and b once.
void residual_layernorm_forward(const Tensor& residual_out, const Tensor& ln_out, const Tensor& mean,
                                const Tensor& rstd, const Tensor& a, const Tensor& b, const Tensor& weight,
                                const Tensor& bias, double eps);
// dinp, dweight, dbias all accumulated (+=).
void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd);

}  // namespace mt::kernels::gpu
