// The optimizer step over a model's flat buffers: global gradient-norm clipping, then AdamW per parameter
// (decay on matrices and embeddings only, as the parameter table says). fp32 moments live here.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "kernels/adamw.h"
#include "model/param_table.h"

namespace mt {

struct OptimizerSettings {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;  // 0 = off
};

class Optimizer {
 public:
  Optimizer(const ParamTable& table, DType dtype, Device device, const OptimizerSettings& s);

  // One update with learning rate `lr`. Leaves the gradient's global norm (before clipping) in grad_norm()[0]
  // on the device; nothing is read back to the host.
  void step(const Tensor& params, const Tensor& grads, double lr);
  const Tensor& grad_norm() const { return norm_; }
  int64_t steps_taken() const { return t_; }
  size_t state_bytes() const { return m_.nbytes() + v_.nbytes(); }

 private:
  const ParamTable& table_;
  OptimizerSettings s_;
  Tensor m_, v_;
  Tensor norm_sq_, norm_, scale_;  // 1-element device scalars
  int64_t t_ = 0;
};

}  // namespace mt
