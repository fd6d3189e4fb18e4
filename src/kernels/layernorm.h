// LayerNorm over the last dimension (eps 1e-5, as GPT-2), forward and backward.
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

constexpr double kLayerNormEps = 1e-5;

// out[N, C] = (inp - mean) * rstd * weight + bias; saves mean[N] and rstd[N] for the backward pass.
void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias);

// dinp += ... (ACCUMULATED: a LayerNorm input is always the residual stream, whose gradient already holds
// the skip connection's share), dweight += ..., dbias += ...
void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd);

}  // namespace mt::kernels
