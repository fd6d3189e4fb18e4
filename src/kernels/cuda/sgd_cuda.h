// GPU SGD with momentum over flat buffers (kernels/sgd.h): declarations only, without CUDA headers, so every build
// can include them. The entry point in kernels/sgd.cpp checks the arguments.
#pragma once
#include "core/tensor.h"
#include "kernels/sgd.h"

namespace mt::kernels::gpu {

// params and buf updated in place; grad_scale[0] is read on the device (no host synchronisation).
void sgd_update(const Tensor& params, const Tensor& grads, const Tensor& buf, const Tensor& grad_scale,
                const SGDHyper& h);
// Local SGD's outer step, in place on all three.
void outer_nesterov_update(const Tensor& anchor, const Tensor& velocity, const Tensor& x, double lr, double momentum);

}  // namespace mt::kernels::gpu
