// SGD with momentum over flat buffers, with AdamW's decoupled weight decay and PyTorch's momentum rule
// (dampening 0, not Nesterov):
//   p -= lr * wd * p;  b = momentum * b + g;  p -= lr * b
// where g = grad * grad_scale[0]. The update is linear in g, which is what makes local SGD with
// optim.sync_every = 1 equal synchronous training (docs/local_sgd.md).
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

struct SGDHyper {
  double lr = 1e-3, momentum = 0.9, weight_decay = 0.0;
};

// params, grads, buf: equal numel; params and buf fp32 (or fp64 in tests), grads fp32 or fp64. params and buf
// are updated in place. grad_scale: a 1-element tensor.
void sgd_update(const Tensor& params, const Tensor& grads, const Tensor& buf, const Tensor& grad_scale,
                const SGDHyper& h);

}  // namespace mt::kernels
