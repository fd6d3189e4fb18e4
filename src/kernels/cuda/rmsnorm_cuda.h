// GPU RMSNorm (kernels/rmsnorm.h): declarations only, without CUDA headers, so every build can include them.
// The public entry points in kernels/rmsnorm.cpp check the arguments; these assume checked tensors on the GPU.
#pragma once
#include "core/tensor.h"

namespace mt::kernels::gpu {

// out = inp * rstd * weight; rstd overwritten.
void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight, double eps);
// dinp and dweight both accumulated (+=).
void rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                      const Tensor& weight, const Tensor& rstd);

}  // namespace mt::kernels::gpu
