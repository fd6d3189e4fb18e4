// CPU elementwise ops (see kernels/elementwise.h). S, D are storage types (float, double, bf16, fp16).
#pragma once
#include <cstdint>

#include "kernels/cpu/storage.h"

namespace mt::kernels::cpu {

template <typename S>
void add_forward(S* out, const S* a, const S* b, int64_t n);  // out may alias a or b
// dst += src, the sum formed in the wider of the two accumulation types and rounded once into dst.
template <typename D, typename S>
void accumulate(D* dst, const S* src, int64_t n);

template <typename S>
void bias_add(S* out, const S* bias, int64_t N, int64_t OC);  // out[N, OC] += bias[OC]

}  // namespace mt::kernels::cpu
