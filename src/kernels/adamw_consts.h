// AdamW's per-step scalars, bias corrections included, each rounded once to the parameter type P on the host: one
// definition for the CPU and the GPU kernels, so both devices apply the same update constants bit for bit.
#pragma once
#include <cmath>

#include "kernels/adamw.h"

namespace mt::kernels {

template <typename P>
struct AdamWConsts {
  P decay, b1, one_minus_b1, b2, one_minus_b2, bc2_sqrt, neg_step, eps;
};

// PyTorch's (1.13, single-tensor path) scalars: 1 - lr*wd, the betas and their complements, sqrt(1 - b2^t) and
// -lr / (1 - b1^t), computed in double and rounded to P where PyTorch rounds its Python floats.
template <typename P>
AdamWConsts<P> adamw_consts(const AdamWHyper& h) {
  const double t = double(h.step);
  AdamWConsts<P> k;
  k.decay = P(1.0 - h.lr * h.weight_decay);
  k.b1 = P(h.beta1), k.one_minus_b1 = P(1.0 - h.beta1);
  k.b2 = P(h.beta2), k.one_minus_b2 = P(1.0 - h.beta2);
  k.bc2_sqrt = P(std::sqrt(1.0 - std::pow(h.beta2, t)));
  k.neg_step = P(-(h.lr / (1.0 - std::pow(h.beta1, t))));
  k.eps = P(h.eps);
  return k;
}

}  // namespace mt::kernels
