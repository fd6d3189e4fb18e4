// CPU causal multi-head attention (see kernels/attention.h for the contract). S is the activation storage type
// (float, double, bf16, fp16); datt is scratch in the accumulation type acc_t<S> (the fp64 kernel uses it; the others
// keep each head's dP and dS in their thread's cache).
#pragma once
#include <cstdint>

#include "kernels/cpu/storage.h"

namespace mt::kernels::cpu {

template <typename S>
void attention_forward(S* out, S* att, const S* qkv, int64_t B, int64_t T_, int64_t C, int64_t NH);

template <typename S>
void attention_backward(S* dqkv, acc_t<S>* datt, const S* dout, const S* qkv, const S* att, int64_t B, int64_t T_,
                        int64_t C, int64_t NH);

}  // namespace mt::kernels::cpu
