// CPU SwiGLU, see kernels/swiglu.h. S is the storage type (float, double, bf16, fp16).
#pragma once
#include <cstdint>

#include "kernels/cpu/storage.h"

namespace mt::kernels::cpu {

// inp [N, 2H] (gate | up per row), out [N, H].
template <typename S>
void swiglu_forward(S* out, const S* inp, int64_t N, int64_t H);
// dinp [N, 2H] overwritten from dout [N, H]; no overlap between dinp and dout or inp.
template <typename S>
void swiglu_backward(S* dinp, const S* dout, const S* inp, int64_t N, int64_t H);

}  // namespace mt::kernels::cpu
