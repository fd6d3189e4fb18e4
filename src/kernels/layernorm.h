// LayerNorm over the last dimension (eps 1e-5, as GPT-2), forward and backward, and the residual add fused with
// the LayerNorm that follows it.
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

// residual_out[N, C] = a + b (each element rounded once to S; residual_out may alias a or b), then
// ln_out = LayerNorm(residual_out) with mean and rstd saved, computed from the ROUNDED residual_out: the results
// equal add_forward(residual_out, a, b) followed by layernorm_forward(ln_out, mean, rstd, residual_out, weight,
// bias) (bit for bit on the CPU, which runs exactly that). On the GPU one kernel reads a and b once, where the
// composition would read the residual back for the LayerNorm. Dtypes as layernorm_forward, with a, b and
// residual_out of the activation dtype S; ln_out must not alias a, b or residual_out.
void residual_layernorm_forward(const Tensor& residual_out, const Tensor& ln_out, const Tensor& mean,
                                const Tensor& rstd, const Tensor& a, const Tensor& b, const Tensor& weight,
                                const Tensor& bias);

// dinp += ... (ACCUMULATED: a LayerNorm input is always the residual stream, whose gradient already holds
// the skip connection's share), dweight += ..., dbias += ...
void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd);

}  // namespace mt::kernels
