// CPU LayerNorm over rows of C (see kernels/layernorm.h for the contract). S is the activation storage type
// (float, double, bf16, fp16); the statistics and parameter gradients are in its accumulation type acc_t<S>.
#pragma once
#include <cstdint>

#include "kernels/cpu/storage.h"

namespace mt::kernels::cpu {

template <typename S>
void layernorm_forward(S* out, acc_t<S>* mean, acc_t<S>* rstd, const S* inp, const S* weight, const S* bias,
                       int64_t N, int64_t C, double eps);

// dinp, dweight, dbias are all accumulated (+=).
template <typename S>
void layernorm_backward(S* dinp, acc_t<S>* dweight, acc_t<S>* dbias, const S* dout, const S* inp, const S* weight,
                        const acc_t<S>* mean, const acc_t<S>* rstd, int64_t N, int64_t C);

}  // namespace mt::kernels::cpu
