// RMSNorm over the last dimension (the Llama family's normalisation), forward and backward:
// out = inp * rstd * weight with rstd = 1 / sqrt(mean(inp^2) + eps) per row: no mean subtraction and no bias.
// Dtypes: inp, out, weight, dout and dinp share the activation dtype S (fp32, fp64, bf16 or fp16); rstd and
// dweight are in its accumulation dtype A (fp64 for fp64, else fp32), as LayerNorm's statistics (layernorm.h).
// All arithmetic is in A; each S output element is rounded once (inp * rstd * weight in one step, not the
// normalised row rounded to S before the weight multiplies it).
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

// out[N, C] = inp * rstd * weight (overwritten); saves rstd[N] (overwritten) for the backward pass. inp is [..., C]
// (N the product of the leading dimensions), weight [C]; eps >= 0 (the model's configured value, 1e-5 or 1e-6).
void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight, double eps);

// dinp += rstd * (g - xhat * mean(g * xhat)) with g = dout * weight and xhat = inp * rstd (ACCUMULATED: an RMSNorm
// input is always the residual stream, whose gradient already holds the skip connection's share);
// dweight += sum over rows of dout * xhat. rstd is the one rmsnorm_forward saved for this inp.
void rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                      const Tensor& weight, const Tensor& rstd);

}  // namespace mt::kernels
