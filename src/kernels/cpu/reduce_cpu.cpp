// CPU reductions in double. Each thread sums a fixed contiguous chunk and the partial sums are added in thread
// order, so for a given thread count the result is bitwise reproducible.
#include "kernels/cpu/reduce_cpu.h"

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {
namespace {
// A plain function over a restrict pointer: inside the OpenMP lambda (x captured by reference) GCC compiled
// the loop to gathers, at ~12 GB/s.
template <bool kSquare, typename T>
double chunk_sum(const T* __restrict x, int64_t n) {
  double s = 0;
  if constexpr (kSquare) {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += double(load(x[i])) * double(load(x[i]));
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += double(load(x[i]));
  }
  return s;
}

template <bool kSquare, typename T>
double reduce(const T* x, int64_t n) {
  constexpr int kMaxThreads = 256;
  double part[kMaxThreads] = {};
  int used = 1;
  auto chunk = [x](int64_t b, int64_t e) { return chunk_sum<kSquare>(x + b, e - b); };
  if (n <= kParallelGrain || omp_get_max_threads() == 1 || omp_in_parallel()) return chunk(0, n);
#pragma omp parallel num_threads(std::min(omp_get_max_threads(), kMaxThreads))
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t per = (n + nt - 1) / nt, b = std::min(n, t * per), e = std::min(n, b + per);
    part[t] = chunk(b, e);
#pragma omp single
    used = int(nt);
  }
  double s = 0;
  for (int t = 0; t < used; ++t) s += part[t];
  return s;
}
}  // namespace

template <typename T>
double sum(const T* x, int64_t n) {
  return reduce<false>(x, n);
}
template <typename T>
double sum_squares(const T* x, int64_t n) {
  return reduce<true>(x, n);
}

#define MT_REDUCE_INSTANTIATE(S)                 \
  template double sum<S>(const S*, int64_t); \
  template double sum_squares<S>(const S*, int64_t);
MT_REDUCE_INSTANTIATE(float)
MT_REDUCE_INSTANTIATE(double)
MT_REDUCE_INSTANTIATE(bf16)
MT_REDUCE_INSTANTIATE(fp16)
#undef MT_REDUCE_INSTANTIATE

}  // namespace mt::kernels::cpu
