// SwiGLU, the gated activation of a Llama MLP: out = silu(gate) * up, silu(x) = x * sigmoid(x), where gate and up
// are the outputs of two separate projections (each its own matmul into a contiguous tensor).
// All arguments share one dtype (fp32, fp64, bf16 or fp16), device and shape [..., H]; 16-bit values are computed
// in fp32 and each output element is rounded once. The op is elementwise: the shape only has to agree.
//
// Aliasing: every element's inputs are read before its outputs are written, by the same thread, so an output may
// be the very same tensor as an input (equal data pointers): the gradients can replace the activations in place.
// Any other overlap (a view shifted by some elements) would let one element's write clobber another's unread input
// and is refused, as is one output overlapping the other.
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

// out (overwritten) = silu(gate) * up. out may alias gate or up.
void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up);

// dgate and dup (overwritten) = the gradients of out w.r.t. gate and up, from dout:
//   dgate = dout * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate))),  dup = dout * silu(gate).
// Each of dgate and dup may alias any of dout, gate and up (dgate = gate and dup = up in a model's backward pass);
// dgate and dup must not overlap each other.
void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate, const Tensor& up);

}  // namespace mt::kernels
