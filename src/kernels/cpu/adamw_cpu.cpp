// CPU AdamW. The arithmetic follows torch.optim.AdamW (1.13, single-tensor path) step by step, with each Python
// scalar rounded to the parameter type where PyTorch rounds it, so fp32 runs agree with PyTorch to the last bits
// as far as the order of operations allows (the scalars: kernels/adamw_consts.h, shared with the GPU kernel):
//   p *= (1 - lr*wd);  m = m*b1 + g*(1-b1);  v = v*b2 + g*g*(1-b2);
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps;  p += (-lr / (1 - b1^t)) * (m / denom)
// With a 16-bit `rounded`, the new p is also stored there, rounded once (storage.h's store, as copy_convert).
#include "kernels/cpu/adamw_cpu.h"

#include <cmath>
#include <type_traits>

#include "kernels/adamw_consts.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/storage.h"

namespace mt::kernels::cpu {

namespace {
// One contiguous range. A separate function with restrict pointers and the scalars passed by value: captured
// by reference in the OpenMP lambda, they were reloaded through memory every iteration and the loop ran scalar.
template <typename P, typename G, typename R>
void adamw_range(P* __restrict params, const G* __restrict grads, P* __restrict m, P* __restrict v,
                 R* __restrict rounded, int64_t n, const AdamWConsts<P> k, const P gs) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const P g = P(grads[i]) * gs;
    const P p = params[i] * k.decay;
    const P mi = m[i] * k.b1 + g * k.one_minus_b1;
    const P vi = v[i] * k.b2 + g * g * k.one_minus_b2;
    const P denom = std::sqrt(vi) / k.bc2_sqrt + k.eps;
    const P updated = p + k.neg_step * (mi / denom);
    params[i] = updated;
    if constexpr (!std::is_void_v<R>) store(rounded[i], updated);
    m[i] = mi;
    v[i] = vi;
  }
}
}  // namespace

template <typename P, typename G, typename R>
void adamw_update(P* params, const G* grads, P* m, P* v, double grad_scale, int64_t n, const AdamWHyper& h,
                  R* rounded) {
  const AdamWConsts<P> k = adamw_consts<P>(h);
  const P gs = P(grad_scale);
  parallel_ranges(n, [=](int64_t b, int64_t e) {
    R* r = nullptr;
    if constexpr (!std::is_void_v<R>) r = rounded + b;
    adamw_range(params + b, grads + b, m + b, v + b, r, e - b, k, gs);
  });
}

template void adamw_update<float, float, void>(float*, const float*, float*, float*, double, int64_t,
                                              const AdamWHyper&, void*);
template void adamw_update<float, float, bf16>(float*, const float*, float*, float*, double, int64_t,
                                              const AdamWHyper&, bf16*);
template void adamw_update<float, float, fp16>(float*, const float*, float*, float*, double, int64_t,
                                              const AdamWHyper&, fp16*);
template void adamw_update<double, double, void>(double*, const double*, double*, double*, double, int64_t,
                                                 const AdamWHyper&, void*);
template void adamw_update<float, double, void>(float*, const double*, float*, float*, double, int64_t,
                                                const AdamWHyper&, void*);

}  // namespace mt::kernels::cpu
