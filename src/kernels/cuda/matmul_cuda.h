// GPU matmul over cuBLASLt (kernels/matmul.h has the contract; these are called by its dispatch after the
// argument checks, with N, C, OC already derived). No CUDA header here, so kernels/matmul.cpp includes it in
// every build.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "kernels/matmul.h"

namespace mt::kernels::gpu {

// out[N, OC] = inp[N, C] @ W + bias (bias optional), the bias fused as cuBLASLt's BIAS epilogue.
void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias, int64_t N,
                    int64_t C, int64_t OC, WeightLayout layout);

// dinp = dout @ W^T (overwritten), dweight += inp^T @ dout and dbias += column sums of dout (both accumulated in
// the fp32/fp64 gradient); each is skipped when undefined.
void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight, int64_t N, int64_t C, int64_t OC, WeightLayout layout);

// pre = inp @ W + bias, out = gelu_tanh(pre) in one cuBLASLt call (GELU_AUX_BIAS epilogue: D = out, aux = pre).
// Returns false, having written nothing, where the epilogue does not apply (fp32/fp64, OC not a multiple of 8,
// or no cuBLASLt algorithm): the caller then composes matmul_forward and gelu_forward.
bool matmul_bias_gelu_forward(const Tensor& pre, const Tensor& out, const Tensor& inp, const Tensor& weight,
                              const Tensor& bias, int64_t N, int64_t C, int64_t OC, WeightLayout layout);

}  // namespace mt::kernels::gpu
