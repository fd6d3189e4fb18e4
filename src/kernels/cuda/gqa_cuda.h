// GPU grouped-query attention expansion and reduction (kernels/gqa.h): declarations only, without CUDA headers, so
// every build can include them. The entry points in kernels/gqa.cpp check the arguments.
#pragma once
#include "core/tensor.h"

namespace mt::kernels::gpu {

void gqa_expand(const Tensor& qkv_full, const Tensor& q, const Tensor& k, const Tensor& v, int n_head, int n_kv_head,
                int head_size);
void gqa_reduce(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dqkv_full, int n_head,
                int n_kv_head, int head_size);

}  // namespace mt::kernels::gpu
