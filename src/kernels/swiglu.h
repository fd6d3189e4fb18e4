// SwiGLU, the gated activation of a Llama MLP: out = silu(gate) * up, silu(x) = x * sigmoid(x), with gate and up
// the two halves of one fused projection's output row.
// All arguments share one dtype (fp32, fp64, bf16 or fp16); 16-bit values are computed in fp32 and each output
// element is rounded once.
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

// inp [..., 2H]: columns [0, H) of each row are the gate, [H, 2H) the up projection; out [..., H] (overwritten).
void swiglu_forward(const Tensor& out, const Tensor& inp);

// dinp [..., 2H] (overwritten) = the gradient of out w.r.t. inp, from dout [..., H]:
//   dgate = dout * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate))),  dup = dout * silu(gate).
// dinp must not overlap dout or inp.
void swiglu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp);

}  // namespace mt::kernels
