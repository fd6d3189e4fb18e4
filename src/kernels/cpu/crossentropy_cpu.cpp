// CPU softmax + cross-entropy, one row per iteration, rows split across OpenMP threads. Per row: the max, then
// exp(l - max) (Eigen's vectorised exp) written straight into dlogits and summed, then one scaling pass. The
// target's logit is read first, so dlogits may overwrite logits in place.
#include "kernels/cpu/crossentropy_cpu.h"

#include <cmath>

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {

template <typename T, typename L>
void softmax_xent_forward_backward(L* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N,
                                   int64_t Vp, int64_t vocab, double dloss) {
#pragma omp parallel for schedule(static) if (N * Vp > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T* l = logits + n * Vp;
    const int32_t t = targets[n];
    const T lt = l[t];
    CArrMap<T> row(l, vocab);
    const T mx = row.maxCoeff();
    double sum;
    if (dlogits) {
      ArrMap<T> d(dlogits + n * Vp, vocab);
      d = (row - mx).exp();  // elementwise: safe when d aliases row
      sum = double(d.sum());
      d *= T(dloss / sum);
      d[t] -= T(dloss);
      for (int64_t v = vocab; v < Vp; ++v) dlogits[n * Vp + v] = T(0);
    } else {
      sum = double((row - mx).exp().sum());
    }
    losses[n] = L(std::log(sum) + double(mx) - double(lt));
  }
}

template void softmax_xent_forward_backward<float, float>(float*, float*, const float*, const int32_t*, int64_t,
                                                          int64_t, int64_t, double);
template void softmax_xent_forward_backward<float, double>(double*, float*, const float*, const int32_t*, int64_t,
                                                           int64_t, int64_t, double);
template void softmax_xent_forward_backward<double, float>(float*, double*, const double*, const int32_t*, int64_t,
                                                           int64_t, int64_t, double);
template void softmax_xent_forward_backward<double, double>(double*, double*, const double*, const int32_t*,
                                                            int64_t, int64_t, int64_t, double);

}  // namespace mt::kernels::cpu
