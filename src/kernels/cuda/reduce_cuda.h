// GPU reductions that stay on the device (kernels/reduce.h): declarations only, without CUDA headers, so every
// build can include them. The entry points in kernels/reduce.cpp check the arguments.
#pragma once
#include "core/tensor.h"

namespace mt::kernels::gpu {

void sum_accumulate(const Tensor& acc, const Tensor& x);          // acc[0] += sum(x), in double
void sum_squares_accumulate(const Tensor& acc, const Tensor& x);  // acc[0] += sum(x * x), in double
// clip_scale of kernels/reduce.h, computed by one device thread from the device scalar norm_sq: no host sync.
void clip_scale(const Tensor& scale, const Tensor& norm, const Tensor& norm_sq, double max_norm,
                double inv_loss_scale);

}  // namespace mt::kernels::gpu
