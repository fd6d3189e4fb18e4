// CPU matmul (Eigen GEMM + an OpenMP bias pass); see kernels/matmul.h for the contract.
#pragma once
#include <cstdint>

#include "kernels/matmul.h"

namespace mt::kernels::cpu {

// Raw row-major pointers: inp[N, C], weight [C, OC] (InOut) or [OC, C] (OutIn), out[N, OC]; bias may be null.
template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC,
                    WeightLayout layout);

// dinp (=, may be null), dweight (+=, may be null), dbias (+=, may be null).
template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int64_t N,
                     int64_t C, int64_t OC, WeightLayout layout);

}  // namespace mt::kernels::cpu
