// CPU LayerNorm over rows of C (see kernels/layernorm.h for the contract).
#pragma once
#include <cstdint>

namespace mt::kernels::cpu {

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int64_t N,
                       int64_t C, double eps);

// dinp, dweight, dbias are all accumulated (+=).
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, int64_t N, int64_t C);

}  // namespace mt::kernels::cpu
