// GPU fused softmax + cross-entropy over padded logits (kernels/crossentropy.h): declarations only, without CUDA
// headers, so every build can include them. The entry point in kernels/crossentropy.cpp checks the arguments
// (but cannot read device targets: see crossentropy_cuda.cu for what an out-of-range target does on the GPU).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mt::kernels::gpu {

// losses[N] overwritten; dlogits (optional, may alias logits) overwritten with (softmax - onehot) * dloss.
void softmax_xent_forward_backward(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                   const Tensor& targets, int64_t vocab, double dloss);

}  // namespace mt::kernels::gpu
