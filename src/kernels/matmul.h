// Matmul with bias, forward and backward. Row-major throughout; N = B*T rows.
// Weight layouts: GPT-2's Conv1D weights are stored [in, out] (InOut); the tied LM head reads the token
// embedding wte[V, C] as [out, in] (OutIn), so the head needs no transposed copy.
// Dtypes: inp, weight, bias, out, dout and dinp share the activation dtype S (fp32, fp64, bf16 or fp16);
// dweight and dbias are in its accumulation dtype A (fp64 for fp64, else fp32). The product accumulates in A
// and each S output element is rounded once (as cuBLASLt with fp32 accumulation does).
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

enum class WeightLayout { InOut, OutIn };

// out[N, OC] = inp[N, C] @ W + bias[OC]        (bias may be undefined: no bias). out is overwritten.
void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                    WeightLayout layout);

// pre[N, OC] = inp @ W + bias (saved for the backward pass), out[N, OC] = gelu_tanh(pre), both overwritten (they
// must not alias; bias may be undefined). The CPU runs matmul_forward then gelu_forward; CUDA fuses the GELU as
// cuBLASLt's GELU_AUX_BIAS epilogue for bf16/fp16 when OC is a multiple of 8 (its aux leading-dimension rule), and
// composes the two kernels otherwise (fp32, fp64). The backward pass is gelu_backward then matmul_backward.
void matmul_bias_gelu_forward(const Tensor& pre, const Tensor& out, const Tensor& inp, const Tensor& weight,
                              const Tensor& bias, WeightLayout layout = WeightLayout::InOut);

// dinp[N, C] = dout @ W^T    (overwritten; skipped when dinp is undefined)
// dweight   += inp^T @ dout  (accumulated in A, in the weight's layout; skipped when dweight is undefined)
// dbias     += sum_n dout    (accumulated in A; skipped when dbias is undefined)
// When dweight is the weight's own storage (ZeRO-3's gradients written over the gathered parameters), dinp is
// computed first, then dweight and dbias are zeroed and take the gradients: the weight is read no further.
void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight, WeightLayout layout);

}  // namespace mt::kernels
