// Causal multi-head self-attention, forward and backward.
// qkv[B, T, 3C] holds q | k | v (each C = NH * HS wide, head h at columns h*HS .. h*HS+HS-1 of each part),
// exactly GPT-2's c_attn output. Scores are scaled by 1/sqrt(HS).
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

// out[B, T, C] = softmax(q k^T / sqrt(HS) + causal mask) v, per head; att[B, NH, T, T] saves the softmax
// probabilities (entries above the diagonal are written as 0). out and att are overwritten.
void attention_forward(const Tensor& out, const Tensor& att, const Tensor& qkv, int n_head);

// dqkv[B, T, 3C] = gradient of out w.r.t. qkv (overwritten). datt[B, NH, T, T] is scratch.
void attention_backward(const Tensor& dqkv, const Tensor& datt, const Tensor& dout, const Tensor& qkv,
                        const Tensor& att, int n_head);

}  // namespace mt::kernels
