// CPU AdamW. The arithmetic follows torch.optim.AdamW (1.13, single-tensor path) step by step, with each Python
// scalar rounded to the parameter type where PyTorch rounds it, so fp32 runs agree with PyTorch to the last bits
// as far as the order of operations allows:
//   p *= (1 - lr*wd);  m = m*b1 + g*(1-b1);  v = v*b2 + g*g*(1-b2);
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps;  p += (-lr / (1 - b1^t)) * (m / denom)
#include "kernels/cpu/adamw_cpu.h"

#include <cmath>

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {

namespace {
// The update's scalars, each rounded to the parameter type once.
template <typename P>
struct AdamWConsts {
  P decay, b1, one_minus_b1, b2, one_minus_b2, bc2_sqrt, neg_step, eps, gs;
};

// One contiguous range. A separate function with restrict pointers and the scalars passed by value: captured
// by reference in the OpenMP lambda, they were reloaded through memory every iteration and the loop ran scalar.
template <typename P, typename G>
void adamw_range(P* __restrict params, const G* __restrict grads, P* __restrict m, P* __restrict v, int64_t n,
                 const AdamWConsts<P> k) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const P g = P(grads[i]) * k.gs;
    const P p = params[i] * k.decay;
    const P mi = m[i] * k.b1 + g * k.one_minus_b1;
    const P vi = v[i] * k.b2 + g * g * k.one_minus_b2;
    const P denom = std::sqrt(vi) / k.bc2_sqrt + k.eps;
    params[i] = p + k.neg_step * (mi / denom);
    m[i] = mi;
    v[i] = vi;
  }
}
}  // namespace

template <typename P, typename G>
void adamw_update(P* params, const G* grads, P* m, P* v, double grad_scale, int64_t n, const AdamWHyper& h) {
  const double t = double(h.step);
  AdamWConsts<P> k;
  k.decay = P(1.0 - h.lr * h.weight_decay);
  k.b1 = P(h.beta1), k.one_minus_b1 = P(1.0 - h.beta1);
  k.b2 = P(h.beta2), k.one_minus_b2 = P(1.0 - h.beta2);
  k.bc2_sqrt = P(std::sqrt(1.0 - std::pow(h.beta2, t)));
  k.neg_step = P(-(h.lr / (1.0 - std::pow(h.beta1, t))));
  k.eps = P(h.eps);
  k.gs = P(grad_scale);
  parallel_ranges(n, [=](int64_t b, int64_t e) { adamw_range(params + b, grads + b, m + b, v + b, e - b, k); });
}

template void adamw_update<float, float>(float*, const float*, float*, float*, double, int64_t, const AdamWHyper&);
template void adamw_update<double, double>(double*, const double*, double*, double*, double, int64_t,
                                           const AdamWHyper&);
template void adamw_update<float, double>(float*, const double*, float*, float*, double, int64_t,
                                          const AdamWHyper&);

}  // namespace mt::kernels::cpu
