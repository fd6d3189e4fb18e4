// Token + position embedding, forward and backward.
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

// out[B, T, C] = wte[tokens[b, t]] + wpe[t]. tokens is int32 [B, T]; wte is [Vp, C], wpe is [maxT, C].
void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe);

// dwte[tokens[b, t]] += dout[b, t]; dwpe[t] += sum_b dout[b, t]   (both accumulated)
void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens);

}  // namespace mt::kernels
