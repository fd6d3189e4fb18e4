// CPU causal multi-head attention (see kernels/attention.h for the contract).
#pragma once
#include <cstdint>

namespace mt::kernels::cpu {

template <typename T>
void attention_forward(T* out, T* att, const T* qkv, int64_t B, int64_t T_, int64_t C, int64_t NH);

template <typename T>
void attention_backward(T* dqkv, T* datt, const T* dout, const T* qkv, const T* att, int64_t B, int64_t T_,
                        int64_t C, int64_t NH);

}  // namespace mt::kernels::cpu
