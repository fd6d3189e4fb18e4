// CPU elementwise ops: contiguous chunks per OpenMP thread, unit-stride vector loops. Each element is widened
// with load(), added in the accumulation type and rounded once with store() (both identities for fp32/fp64).
#include "kernels/cpu/elementwise_cpu.h"

#include <type_traits>

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {

template <typename S>
void add_forward(S* out, const S* a, const S* b, int64_t n) {
  parallel_ranges(n, [&](int64_t s, int64_t e) {
#pragma omp simd
    for (int64_t i = s; i < e; ++i) store(out[i], load(a[i]) + load(b[i]));
  });
}

template <typename D, typename S>
void accumulate(D* dst, const S* src, int64_t n) {
  // fp64 if either side is fp64 (fp64 sums then round into a 16-bit dst via fp32, which only gradient checks
  // could meet), else fp32.
  using A = std::conditional_t<std::is_same_v<D, double> || std::is_same_v<S, double>, double, float>;
  parallel_ranges(n, [&](int64_t s, int64_t e) {
#pragma omp simd
    for (int64_t i = s; i < e; ++i) store(dst[i], acc_t<D>(A(load(dst[i])) + A(load(src[i]))));
  });
}

template <typename S>
void bias_add(S* out, const S* bias, int64_t N, int64_t OC) {
#pragma omp parallel for schedule(static) if (N * OC > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    S* o = out + n * OC;
#pragma omp simd
    for (int64_t c = 0; c < OC; ++c) store(o[c], load(o[c]) + load(bias[c]));
  }
}

#define MT_ACCUMULATE_INSTANTIATE(D)                                     \
  template void accumulate<D, float>(D*, const float*, int64_t);   \
  template void accumulate<D, double>(D*, const double*, int64_t); \
  template void accumulate<D, bf16>(D*, const bf16*, int64_t);     \
  template void accumulate<D, fp16>(D*, const fp16*, int64_t);
#define MT_ELEMENTWISE_INSTANTIATE(S)                                  \
  template void add_forward<S>(S*, const S*, const S*, int64_t); \
  template void bias_add<S>(S*, const S*, int64_t, int64_t);     \
  MT_ACCUMULATE_INSTANTIATE(S)
MT_ELEMENTWISE_INSTANTIATE(float)
MT_ELEMENTWISE_INSTANTIATE(double)
MT_ELEMENTWISE_INSTANTIATE(bf16)
MT_ELEMENTWISE_INSTANTIATE(fp16)
#undef MT_ELEMENTWISE_INSTANTIATE
#undef MT_ACCUMULATE_INSTANTIATE

}  // namespace mt::kernels::cpu
