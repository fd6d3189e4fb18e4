// GPU causal flash attention (kernels/attention.h has the contract): forward and backward never form the T x T
// matrix. On CUDA the forward saves the log-sum-exp of each query's scaled scores, lse [B, NH, T] in the
// accumulation dtype, instead of the probabilities; the backward recomputes P from it. No CUDA header here.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mt::kernels::gpu {

// out[B, T, C] (overwritten), lse[B, NH, T] (overwritten) from qkv[B, T, 3C]; HS = C / NH a multiple of 16, <= 128.
void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH);

// Whether the 16-bit calls may run on cuDNN's fused attention (attention_cudnn.h; builds with cuDNN only): true by
// default; false keeps them on the kernels of this file (kernels/attention.h: set_gpu_attention).
void allow_cudnn_attention(bool allowed);

// dqkv[B, T, 3C] (overwritten) from dout, qkv, the forward's out and lse; delta [B, NH, T] (accumulation dtype) is
// scratch for D = rowsum(dout * out).
void attention_backward(const Tensor& dqkv, const Tensor& delta, const Tensor& dout, const Tensor& qkv,
                        const Tensor& out, const Tensor& lse, int64_t B, int64_t T, int64_t C, int64_t NH);

}  // namespace mt::kernels::gpu
