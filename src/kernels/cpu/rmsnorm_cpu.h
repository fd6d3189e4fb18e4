// CPU RMSNorm over rows of C (see kernels/rmsnorm.h for the contract). S is the activation storage type (float,
// double, bf16, fp16); rstd and the weight gradient are in its accumulation type acc_t<S>.
#pragma once
#include <cstdint>

#include "kernels/cpu/storage.h"

namespace mt::kernels::cpu {

template <typename S>
void rmsnorm_forward(S* out, acc_t<S>* rstd, const S* inp, const S* weight, int64_t N, int64_t C, double eps);

// dinp and dweight are both accumulated (+=).
template <typename S>
void rmsnorm_backward(S* dinp, acc_t<S>* dweight, const S* dout, const S* inp, const S* weight, const acc_t<S>* rstd,
                      int64_t N, int64_t C);

}  // namespace mt::kernels::cpu
