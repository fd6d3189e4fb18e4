// Optimizer step: clip by global norm (computed on the device), then AdamW per parameter.
#include "optim/optimizer.h"

#include "kernels/reduce.h"

namespace mt {

Optimizer::Optimizer(const ParamTable& table, DType dtype, Device device, const OptimizerSettings& s)
    : table_(table), s_(s) {
  m_ = Tensor::zeros({table.total_numel()}, dtype, device);
  v_ = Tensor::zeros({table.total_numel()}, dtype, device);
  norm_sq_ = Tensor::zeros({1}, dtype, device);
  norm_ = Tensor::zeros({1}, dtype, device);
  scale_ = Tensor::zeros({1}, dtype, device);
}

void Optimizer::step(const Tensor& params, const Tensor& grads, double lr) {
  ++t_;
  zero_(norm_sq_);
  kernels::sum_squares_accumulate(norm_sq_, grads);  // alignment gaps in the flat buffer are zero
  kernels::clip_scale(scale_, norm_, norm_sq_, s_.grad_clip);
  kernels::AdamWHyper h;
  h.lr = lr;
  h.beta1 = s_.beta1;
  h.beta2 = s_.beta2;
  h.eps = s_.eps;
  h.step = t_;
  for (const ParamSpec& p : table_.specs()) {
    h.weight_decay = p.decay ? s_.weight_decay : 0.0;
    const Shape flat{p.numel()};
    kernels::adamw_update(params.slice(p.offset, flat), grads.slice(p.offset, flat), m_.slice(p.offset, flat),
                          v_.slice(p.offset, flat), scale_, h);
  }
}

}  // namespace mt
