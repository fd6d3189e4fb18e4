// Causal multi-head self-attention, forward and backward.
// qkv[B, T, 3C] holds q | k | v (each C = NH * HS wide, head h at columns h*HS .. h*HS+HS-1 of each part),
// exactly GPT-2's c_attn output. Scores are scaled by 1/sqrt(HS).
// Dtypes: S (qkv's dtype: fp32, fp64, bf16 or fp16) for qkv, out, att, dout and dqkv; datt is in the
// accumulation dtype A = acc_dtype(S) (fp32, or fp64 when S is fp64). Scores, softmax and products are computed
// in A; each stored element is rounded to S once.
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

// out[B, T, C] = softmax(q k^T / sqrt(HS) + causal mask) v, per head; att[B, NH, T, T] saves the softmax
// probabilities (entries above the diagonal are written as 0). out and att are overwritten. With 16-bit S the
// probabilities are rounded once into att and out is computed in A from those rounded values, as a fused GPU
// kernel rounds P before the P V product.
void attention_forward(const Tensor& out, const Tensor& att, const Tensor& qkv, int n_head);

// dqkv[B, T, 3C] = gradient of out w.r.t. qkv (overwritten), from the att that attention_forward stored.
// datt[B, NH, T, T] (dtype A) is scratch.
void attention_backward(const Tensor& dqkv, const Tensor& datt, const Tensor& dout, const Tensor& qkv,
                        const Tensor& att, int n_head);

}  // namespace mt::kernels
