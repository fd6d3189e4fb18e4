// AdamW over flat buffers (Loshchilov & Hutter), with PyTorch's exact update order so runs compare bit-closely:
//   p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// where g = grad * grad_scale[0] (grad_scale carries gradient clipping and, later, loss-scale unscaling).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mt::kernels {

struct AdamWHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
  int64_t step = 1;  // t, from 1
};

// params, grads, m, v: equal numel, params/m/v fp32 (or fp64 in tests); grads fp32/fp64. All updated in place
// except grads. grad_scale: a 1-element tensor on the same device. rounded (optional: bf16 or fp16, params'
// numel, beside fp32 params): receives the updated params, each rounded once, as copy_convert would write them.
// Why: a mixed-precision step's compute copy, written while the update has each value in a register, instead of
// a second pass that reads the fp32 masters back from memory (on the CPU; the GPU runs the copy after the update).
void adamw_update(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                  const Tensor& grad_scale, const AdamWHyper& h, const Tensor& rounded = Tensor());

}  // namespace mt::kernels
