// CPU SwiGLU, see kernels/swiglu.h. S is the storage type (float, double, bf16, fp16). The op is elementwise over
// the n elements of gate, up and out (dout, dgate, dup).
#pragma once
#include <cstdint>

#include "kernels/cpu/storage.h"

namespace mt::kernels::cpu {

// out = silu(gate) * up; out may alias gate or up (the same pointer).
template <typename S>
void swiglu_forward(S* out, const S* gate, const S* up, int64_t n);
// dgate and dup overwritten; each may alias dout, gate or up (the same pointer), not each other.
template <typename S>
void swiglu_backward(S* dgate, S* dup, const S* dout, const S* gate, const S* up, int64_t n);

}  // namespace mt::kernels::cpu
