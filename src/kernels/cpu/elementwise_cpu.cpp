// CPU elementwise ops: contiguous chunks per OpenMP thread, unit-stride vector loops.
#include "kernels/cpu/elementwise_cpu.h"

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {

template <typename T>
void add_forward(T* out, const T* a, const T* b, int64_t n) {
  parallel_ranges(n, [&](int64_t s, int64_t e) {
#pragma omp simd
    for (int64_t i = s; i < e; ++i) out[i] = a[i] + b[i];
  });
}

template <typename T>
void accumulate(T* dst, const T* src, int64_t n) {
  parallel_ranges(n, [&](int64_t s, int64_t e) {
#pragma omp simd
    for (int64_t i = s; i < e; ++i) dst[i] += src[i];
  });
}

template <typename T>
void bias_add(T* out, const T* bias, int64_t N, int64_t OC) {
#pragma omp parallel for schedule(static) if (N * OC > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    T* o = out + n * OC;
#pragma omp simd
    for (int64_t c = 0; c < OC; ++c) o[c] += bias[c];
  }
}

template void bias_add<float>(float*, const float*, int64_t, int64_t);
template void bias_add<double>(double*, const double*, int64_t, int64_t);
template void add_forward<float>(float*, const float*, const float*, int64_t);
template void add_forward<double>(double*, const double*, const double*, int64_t);
template void accumulate<float>(float*, const float*, int64_t);
template void accumulate<double>(double*, const double*, int64_t);

}  // namespace mt::kernels::cpu
