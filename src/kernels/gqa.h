// Grouped-query attention (n_kv_head < n_head) on top of the multi-head attention kernel (attention.h): the qkv
// projection's narrower output is expanded to the [N, 3 * NH * HS] layout that kernel takes, and the gradient of
// the expansion is reduced back. Query head h uses kv head h / (NH / KV): consecutive query heads share a kv head
// (the order of Llama checkpoints' repeat_kv).
// Layouts per row: qkv [N, (NH + 2 KV) * HS] is q (NH heads) | k (KV heads) | v (KV heads), each head HS
// contiguous elements; qkv_full [N, 3 NH HS] is q | k | v with NH heads each. N is the product of the leading
// dimensions. Both tensors share one dtype (fp32, fp64, bf16 or fp16).
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

// qkv_full (overwritten) = qkv with each kv head repeated for the NH / KV query heads that use it: an exact copy of
// elements. n_head must be a multiple of n_kv_head; with n_head == n_kv_head it is a plain copy.
void gqa_expand(const Tensor& qkv_full, const Tensor& qkv, int n_head, int n_kv_head, int head_size);

// The transpose of gqa_expand: dqkv (overwritten) takes dq unchanged, and each kv head's dk and dv are the sums of
// the NH / KV query heads' dk and dv that use it, summed in the accumulation dtype (fp64 for fp64, else fp32) in
// query-head order and rounded once.
void gqa_reduce(const Tensor& dqkv, const Tensor& dqkv_full, int n_head, int n_kv_head, int head_size);

}  // namespace mt::kernels
