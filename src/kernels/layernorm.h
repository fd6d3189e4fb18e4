// LayerNorm over the last dimension (eps 1e-5, as GPT-2), forward and backward.
// Dtypes: inp, out, weight, bias, dout and dinp share the activation dtype S (fp32, fp64, bf16 or fp16); mean,
// rstd, dweight and dbias are in its accumulation dtype A (fp64 for fp64, else fp32). All arithmetic is in A;
// each S output element is rounded once.
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
