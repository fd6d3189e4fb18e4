// GPU token + position embedding (kernels/embedding.h): declarations only, without CUDA headers, so every build can
// include them. The entry points in kernels/embedding.cpp check the arguments (but cannot read device token ids:
// see embedding_cuda.cu for what an id outside [0, vocab_bound) does on the GPU).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mt::kernels::gpu {

// out[B, T, C] = wte[tokens - v0] + wpe[t]; wpe may be undefined. vocab_bound: the resolved bound (> 0).
void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t v0,
                       int64_t vocab_bound);
// dwte[tokens - v0] += dout, dwpe[t] += sum_b dout (dwpe may be undefined).
void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens, int64_t v0,
                        int64_t vocab_bound);

}  // namespace mt::kernels::gpu
