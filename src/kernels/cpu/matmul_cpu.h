// CPU matmul (Eigen GEMM + an OpenMP bias pass); see kernels/matmul.h for the contract. S is the activation
// storage type (float, double, bf16, fp16); the parameter gradients are in its accumulation type acc_t<S>.
#pragma once
#include <cstdint>

#include "kernels/cpu/storage.h"
#include "kernels/matmul.h"

namespace mt::kernels::cpu {

// Raw row-major pointers: inp[N, C], weight [C, OC] (InOut) or [OC, C] (OutIn), out[N, OC]; bias may be null.
template <typename S>
void matmul_forward(S* out, const S* inp, const S* weight, const S* bias, int64_t N, int64_t C, int64_t OC,
                    WeightLayout layout);

// dinp (=, may be null), dweight (+=, may be null), dbias (+=, may be null).
template <typename S>
void matmul_backward(S* dinp, acc_t<S>* dweight, acc_t<S>* dbias, const S* dout, const S* inp, const S* weight,
                     int64_t N, int64_t C, int64_t OC, WeightLayout layout);

}  // namespace mt::kernels::cpu
