// CPU AdamW. The arithmetic follows torch.optim.AdamW (1.13, single-tensor path) step by step, with each Python
// scalar rounded to the parameter type where PyTorch rounds it, so fp32 runs agree with PyTorch to the last bits
// as far as the order of operations allows:
//   p *= (1 - lr*wd);  m = m*b1 + g*(1-b1);  v = v*b2 + g*g*(1-b2);
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps;  p += (-lr / (1 - b1^t)) * (m / denom)
#include "kernels/cpu/adamw_cpu.h"

#include <cmath>

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {

template <typename P, typename G>
void adamw_update(P* params, const G* grads, P* m, P* v, double grad_scale, int64_t n, const AdamWHyper& h) {
  const double t = double(h.step);
  const P decay = P(1.0 - h.lr * h.weight_decay);
  const P b1 = P(h.beta1), one_minus_b1 = P(1.0 - h.beta1);
  const P b2 = P(h.beta2), one_minus_b2 = P(1.0 - h.beta2);
  const P bc2_sqrt = P(std::sqrt(1.0 - std::pow(h.beta2, t)));
  const P neg_step = P(-(h.lr / (1.0 - std::pow(h.beta1, t))));
  const P eps = P(h.eps);
  const P gs = P(grad_scale);
  parallel_ranges(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const P g = P(grads[i]) * gs;
      const P p = params[i] * decay;
      const P mi = m[i] * b1 + g * one_minus_b1;
      const P vi = v[i] * b2 + g * g * one_minus_b2;
      const P denom = std::sqrt(vi) / bc2_sqrt + eps;
      params[i] = p + neg_step * (mi / denom);
      m[i] = mi;
      v[i] = vi;
    }
  });
}

template void adamw_update<float, float>(float*, const float*, float*, float*, double, int64_t, const AdamWHyper&);
template void adamw_update<double, double>(double*, const double*, double*, double*, double, int64_t,
                                           const AdamWHyper&);
template void adamw_update<float, double>(float*, const double*, float*, float*, double, int64_t,
                                          const AdamWHyper&);

}  // namespace mt::kernels::cpu
