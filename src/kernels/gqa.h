// Grouped-query attention (n_kv_head < n_head) on top of the multi-head attention kernel (attention.h): the q, k
// and v projections' outputs (each its own matmul into a contiguous tensor, k and v narrower than q) are expanded
// to the [N, 3 * NH * HS] layout that kernel takes, and the gradient of the expansion is reduced back. Query head h
// uses kv head h / (NH / KV): consecutive query heads share a kv head (the order of Llama checkpoints' repeat_kv).
// Layouts per row: q [N, NH * HS], k and v [N, KV * HS], each head HS contiguous elements; qkv_full [N, 3 NH HS] is
// q | k | v with NH heads each. N is the product of the leading dimensions, which all the tensors share, as they
// share one dtype (fp32, fp64, bf16 or fp16) and device.
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

// qkv_full (overwritten) = q | k | v with each kv head repeated for the NH / KV query heads that use it: an exact
// copy of elements. n_head must be a multiple of n_kv_head; with n_head == n_kv_head it is a plain concatenation.
// qkv_full must not overlap q, k or v (the inputs may overlap one another: they are only read).
void gqa_expand(const Tensor& qkv_full, const Tensor& q, const Tensor& k, const Tensor& v, int n_head, int n_kv_head,
                int head_size);

// The transpose of gqa_expand: dq, dk and dv (overwritten) from dqkv_full. dq is dqkv_full's q part unchanged, and
// each kv head's dk and dv are the sums of the NH / KV query heads' dk and dv that use it, summed in the
// accumulation dtype (fp64 for fp64, else fp32) in query-head order and rounded once. No two of dq, dk, dv and
// dqkv_full may overlap.
void gqa_reduce(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dqkv_full, int n_head,
                int n_kv_head, int head_size);

}  // namespace mt::kernels
