// CPU softmax + cross-entropy, one row per iteration, rows split across OpenMP threads. Per row: the max, then
// exp(l - max) (Eigen's vectorised exp) written straight into dlogits and summed, then one scaling pass. The
// target's logit is read first, so dlogits may overwrite logits in place.
// 16-bit storage (bf16, fp16): the row is first widened into a per-thread fp32 buffer, the same fp32 code runs on
// that buffer (so every logit of the row is read before any dlogit is written, in place or not), and each dlogit
// is rounded once from it. Max, exp, sum and the loss are fp32/fp64 as for fp32 logits: only the stored gradient
// is 16-bit.
#include "kernels/cpu/crossentropy_cpu.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {

template <typename S, typename L>
void softmax_xent_forward_backward(L* losses, S* dlogits, const S* logits, const int32_t* targets, int64_t N,
                                   int64_t Vp, int64_t vocab, double dloss) {
  using A = acc_t<S>;
#pragma omp parallel for schedule(static) if (N * Vp > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const S* l = logits + n * Vp;
    const int32_t t = targets[n];
    const A lt = load(l[t]);
    // src: the row in A; dst: where exp, then the gradient, is computed (null: losses only).
    const A* src;
    A* dst = nullptr;
    if constexpr (is_16bit<S>) {
      float* buf = thread_scratch(vocab);
      for (int64_t v = 0; v < vocab; ++v) buf[v] = load(l[v]);
      src = buf;
      if (dlogits) dst = buf;
    } else {
      src = l;
      if (dlogits) dst = dlogits + n * Vp;
    }
    CArrMap<A> row(src, vocab);
    const A mx = row.maxCoeff();
    double sum;
    if (dst) {
      ArrMap<A> d(dst, vocab);
      d = (row - mx).exp();  // elementwise: safe when d aliases row
      sum = double(d.sum());
      d *= A(dloss / sum);
      d[t] -= A(dloss);
      S* out = dlogits + n * Vp;
      if constexpr (is_16bit<S>)
        for (int64_t v = 0; v < vocab; ++v) store(out[v], dst[v]);
      for (int64_t v = vocab; v < Vp; ++v) store(out[v], A(0));
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
template void softmax_xent_forward_backward<bf16, float>(float*, bf16*, const bf16*, const int32_t*, int64_t,
                                                         int64_t, int64_t, double);
template void softmax_xent_forward_backward<fp16, float>(float*, fp16*, const fp16*, const int32_t*, int64_t,
                                                         int64_t, int64_t, double);

}  // namespace mt::kernels::cpu
