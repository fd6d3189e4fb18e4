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

// Local SGD's outer step (optim/local_sgd.h): PyTorch's SGD(nesterov=True, dampening 0) on the pseudo-gradient
// d = anchor - x, where x holds the replicas' averaged weights:
//   v = momentum * v + d;  anchor -= lr * (d + momentum * v);  x = anchor
// anchor, velocity, x: equal numel, one float dtype (fp32, or fp64 in tests), one device; all three in place.
void outer_nesterov_update(const Tensor& anchor, const Tensor& velocity, const Tensor& x, double lr, double momentum);

}  // namespace mt::kernels
