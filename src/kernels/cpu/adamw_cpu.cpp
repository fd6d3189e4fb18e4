// CPU AdamW. The arithmetic follows torch.optim.AdamW (1.13, single-tensor path) step by step, with each Python
// scalar rounded to the parameter type where PyTorch rounds it, so fp32 runs agree with PyTorch to the last bits
// as far as the order of operations allows (the scalars: kernels/adamw_consts.h, shared with the GPU kernel):
//   p *= (1 - lr*wd);  m = m*b1 + g*(1-b1);  v = v*b2 + g*g*(1-b2);
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps;  p += (-lr / (1 - b1^t)) * (m / denom)
#include "kernels/cpu/adamw_cpu.h"

#include <cmath>

#include "kernels/adamw_consts.h"
#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {

namespace {
// One contiguous range. A separate function with restrict pointers and the scalars passed by value: captured
// by reference in the OpenMP lambda, they were reloaded through memory every iteration and the loop ran scalar.
template <typename P, typename G>
void adamw_range(P* __restrict params, const G* __restrict grads, P* __restrict m, P* __restrict v, int64_t n,
                 const AdamWConsts<P> k, const P gs) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const P g = P(grads[i]) * gs;
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
  const AdamWConsts<P> k = adamw_consts<P>(h);
  const P gs = P(grad_scale);
  parallel_ranges(n, [=](int64_t b, int64_t e) { adamw_range(params + b, grads + b, m + b, v + b, e - b, k, gs); });
}

template void adamw_update<float, float>(float*, const float*, float*, float*, double, int64_t, const AdamWHyper&);
template void adamw_update<double, double>(double*, const double*, double*, double*, double, int64_t,
                                           const AdamWHyper&);
template void adamw_update<float, double>(float*, const double*, float*, float*, double, int64_t,
                                          const AdamWHyper&);

}  // namespace mt::kernels::cpu
