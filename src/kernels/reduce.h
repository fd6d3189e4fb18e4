// Reductions that stay on the tensor's device (the step loop never reads tensor data back to the host until
// the step's metrics are logged).
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

// acc[0] += sum(x)          acc is a 1-element fp32 or fp64 tensor, x fp32, fp64, bf16 or fp16; the sum is taken
// in double.
void sum_accumulate(const Tensor& acc, const Tensor& x);
// acc[0] += sum(x * x)
void sum_squares_accumulate(const Tensor& acc, const Tensor& x);
// The gradients are those of the loss times a loss scale s (1 without loss scaling), inv_loss_scale = 1 / s:
// norm[0] = sqrt(norm_sq[0]) * inv_loss_scale (the true gradient norm), and
// scale[0] = (max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1) * inv_loss_scale   (PyTorch's
// clip_grad_norm_ rule on the true norm), so grad * scale[0] is the unscaled, clipped gradient.
// scale, norm, norm_sq are 1-element fp32 or fp64 tensors.
void clip_scale(const Tensor& scale, const Tensor& norm, const Tensor& norm_sq, double max_norm,
                double inv_loss_scale = 1.0);

}  // namespace mt::kernels
