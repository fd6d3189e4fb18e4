// GPU block attention for ring attention (kernels/attention_block.h): declarations only, without CUDA headers, so
// every build can include them. The entry points in kernels/attention_block.cpp check the arguments.
#pragma once
#include "core/tensor.h"

namespace mt::kernels::gpu {

void attention_block_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             int n_head, int n_kv_head, bool causal);
void attention_block_merge(const Tensor& out, const Tensor& lse, const Tensor& out_b, const Tensor& lse_b,
                           int n_head);
void attention_block_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                              const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                              int n_head, int n_kv_head, bool causal);

}  // namespace mt::kernels::gpu
