// Elementwise ops over tensors of equal numel: the residual add, gradient accumulation, and the Avg's division.
// Each output element is formed in the accumulation dtype (fp64 for fp64, else fp32) and rounded once.
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

// out = a + b (may alias a or b); out, a, b share one dtype (fp32, fp64, bf16 or fp16).
void add_forward(const Tensor& out, const Tensor& a, const Tensor& b);
// dst += src for any two of fp32, fp64, bf16, fp16 (e.g. a 16-bit gradient into an fp32 one, or back); the sum is
// in fp64 when either is fp64, else fp32.
void accumulate(const Tensor& dst, const Tensor& src);
// out[N, OC] += bias[OC], both of one dtype (row-parallel layers add their replicated bias after the tp all-reduce)
void bias_add(const Tensor& out, const Tensor& bias);
// t /= divisor in place (fp32, bf16 or fp16; the quotient formed in fp32 and rounded once): a collective's Avg
// once its sum is complete, on whichever device holds t.
void divide_(const Tensor& t, int divisor);

}  // namespace mt::kernels
