// CPU elementwise ops (see kernels/elementwise.h).
#pragma once
#include <cstdint>

namespace mt::kernels::cpu {

template <typename T>
void add_forward(T* out, const T* a, const T* b, int64_t n);  // out may alias a or b
template <typename T>
void accumulate(T* dst, const T* src, int64_t n);

template <typename T>
void bias_add(T* out, const T* bias, int64_t N, int64_t OC);  // out[N, OC] += bias[OC]

}  // namespace mt::kernels::cpu
