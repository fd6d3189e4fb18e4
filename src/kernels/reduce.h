// Reductions that stay on the tensor's device (the step loop never reads tensor data back to the host until
// the step's metrics are logged).
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

// acc[0] += sum(x)          acc is a 1-element fp32 or fp64 tensor; the sum is taken in double.
void sum_accumulate(const Tensor& acc, const Tensor& x);
// acc[0] += sum(x * x)
void sum_squares_accumulate(const Tensor& acc, const Tensor& x);
// scale[0] = max_norm > 0 && sqrt(norm_sq) > max_norm ? max_norm / (sqrt(norm_sq) + 1e-6) : 1   (PyTorch's
// clip_grad_norm_ rule); also norm[0] = sqrt(norm_sq[0]).
void clip_scale(const Tensor& scale, const Tensor& norm, const Tensor& norm_sq, double max_norm);

}  // namespace mt::kernels
