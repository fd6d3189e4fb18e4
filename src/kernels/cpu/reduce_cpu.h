// CPU reductions (see kernels/reduce.h). Sums are taken in double.
#pragma once
#include <cstdint>

namespace mt::kernels::cpu {

template <typename T>
double sum(const T* x, int64_t n);
template <typename T>
double sum_squares(const T* x, int64_t n);

}  // namespace mt::kernels::cpu
