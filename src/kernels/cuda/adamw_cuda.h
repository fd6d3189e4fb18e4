// GPU AdamW over flat buffers (kernels/adamw.h): declarations only, without CUDA headers, so every build can include
// them. The entry point in kernels/adamw.cpp checks the arguments.
#pragma once
#include "core/tensor.h"
#include "kernels/adamw.h"

namespace mt::kernels::gpu {

// params, m, v updated in place; grad_scale[0] is read on the device (no host synchronisation).
void adamw_update(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                  const Tensor& grad_scale, const AdamWHyper& h);

}  // namespace mt::kernels::gpu
