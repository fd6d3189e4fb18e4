// CPU vocab-parallel softmax + cross-entropy steps, one row per iteration, rows split across OpenMP threads. The
// per-row arithmetic is the unsharded kernel's (crossentropy_cpu.cpp) cut at the two reductions: Eigen's max and
// vectorised exp over the real columns only, then one scaling pass writing the gradient. Step 3 takes the target
// logit from the reduced stats rather than from the logits, so dlogits may overwrite logits in place.
#include "kernels/cpu/vocab_parallel_cpu.h"

#include <cmath>
#include <limits>

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {

template <typename T>
void vocab_parallel_xent_local_max(T* row_max, const T* logits, int64_t N, int64_t Vl, int64_t nreal) {
  if (nreal == 0) {
    for (int64_t n = 0; n < N; ++n) row_max[n] = -std::numeric_limits<T>::infinity();
    return;
  }
#pragma omp parallel for schedule(static) if (N * nreal > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) row_max[n] = CArrMap<T>(logits + n * Vl, nreal).maxCoeff();
}

template <typename T>
void vocab_parallel_xent_local_sums(T* stats, const T* logits, const int32_t* targets, const T* row_max, int64_t N,
                                    int64_t Vl, int64_t v0, int64_t nreal) {
  T* sum_exp = stats;
  T* target_logit = stats + N;
#pragma omp parallel for schedule(static) if (N * nreal > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T* l = logits + n * Vl;
    sum_exp[n] = nreal > 0 ? (CArrMap<T>(l, nreal) - row_max[n]).exp().sum() : T(0);
    const int64_t j = int64_t(targets[n]) - v0;  // targets < vocab, so an owned target is a real column
    target_logit[n] = (j >= 0 && j < nreal) ? l[j] : T(0);
  }
}

template <typename T, typename L>
void vocab_parallel_xent_finish(L* losses, T* dlogits, const T* logits, const int32_t* targets, const T* row_max,
                                const T* stats, int64_t N, int64_t Vl, int64_t v0, int64_t nreal, double dloss) {
  const T* sum_exp = stats;
  const T* target_logit = stats + N;
#pragma omp parallel for schedule(static) if (dlogits && N * Vl > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T mx = row_max[n];
    const double sum = double(sum_exp[n]);
    losses[n] = L(std::log(sum) + double(mx) - double(target_logit[n]));
    if (!dlogits) continue;
    T* d = dlogits + n * Vl;
    if (nreal > 0) {
      ArrMap<T> dr(d, nreal);
      dr = (CArrMap<T>(logits + n * Vl, nreal) - mx).exp();  // elementwise: safe when d aliases logits
      dr *= T(dloss / sum);
      const int64_t j = int64_t(targets[n]) - v0;
      if (j >= 0 && j < nreal) d[j] -= T(dloss);
    }
    for (int64_t v = nreal; v < Vl; ++v) d[v] = T(0);
  }
}

template void vocab_parallel_xent_local_max<float>(float*, const float*, int64_t, int64_t, int64_t);
template void vocab_parallel_xent_local_max<double>(double*, const double*, int64_t, int64_t, int64_t);
template void vocab_parallel_xent_local_sums<float>(float*, const float*, const int32_t*, const float*, int64_t,
                                                    int64_t, int64_t, int64_t);
template void vocab_parallel_xent_local_sums<double>(double*, const double*, const int32_t*, const double*, int64_t,
                                                     int64_t, int64_t, int64_t);
template void vocab_parallel_xent_finish<float, float>(float*, float*, const float*, const int32_t*, const float*,
                                                       const float*, int64_t, int64_t, int64_t, int64_t, double);
template void vocab_parallel_xent_finish<float, double>(double*, float*, const float*, const int32_t*, const float*,
                                                        const float*, int64_t, int64_t, int64_t, int64_t, double);
template void vocab_parallel_xent_finish<double, float>(float*, double*, const double*, const int32_t*,
                                                        const double*, const double*, int64_t, int64_t, int64_t,
                                                        int64_t, double);
template void vocab_parallel_xent_finish<double, double>(double*, double*, const double*, const int32_t*,
                                                         const double*, const double*, int64_t, int64_t, int64_t,
                                                         int64_t, double);

}  // namespace mt::kernels::cpu
