// CPU reductions (see kernels/reduce.h). Sums are taken in double over any storage type S (float, double,
// bf16, fp16).
#pragma once
#include <cstdint>

#include "kernels/cpu/storage.h"

namespace mt::kernels::cpu {

template <typename S>
double sum(const S* x, int64_t n);
template <typename S>
double sum_squares(const S* x, int64_t n);

}  // namespace mt::kernels::cpu
