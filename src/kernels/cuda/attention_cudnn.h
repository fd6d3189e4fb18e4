// cuDNN's fused causal attention (its flash-attention engines, through the cuDNN frontend's SDPA graphs) for the
// 16-bit GPU attention: the same contract as attention_cuda.h (qkv [B, T, 3C], out [B, T, C], lse [B, NH, T] in
// fp32 holding each query's log-sum-exp of its scaled scores, which is what cuDNN calls the softmax stats).
// Built when CMake finds cuDNN and the header-only cuDNN frontend (docs/cuda.md); attention_cuda.cu dispatches here.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mt::kernels::gpu {

// True when cuDNN has an engine for this problem (bf16 or fp16, head size a multiple of 8 and at most 128). The
// first call per shape builds and caches both graphs; a shape cuDNN has no engine for is remembered and answered
// false (the caller then uses its own kernels), with one warning in the log.
bool cudnn_attention_supported(DType dtype, int64_t B, int64_t T, int64_t C, int64_t NH);

void cudnn_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t B, int64_t T, int64_t C,
                             int64_t NH);
// Deterministic (cuDNN's deterministic backward engine), so a rerun gives the same gradients bit for bit.
void cudnn_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse, int64_t B, int64_t T, int64_t C, int64_t NH);

}  // namespace mt::kernels::gpu
