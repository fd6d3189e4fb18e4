// CPU grouped-query attention expansion and its transpose, see kernels/gqa.h. S is the storage type (float, double,
// bf16, fp16).
#pragma once
#include <cstdint>

#include "kernels/cpu/storage.h"

namespace mt::kernels::cpu {

// q [N, NH HS], k and v [N, KV HS] -> qkv_full [N, 3 NH HS] (overwritten).
template <typename S>
void gqa_expand(S* qkv_full, const S* q, const S* k, const S* v, int64_t N, int n_head, int n_kv_head, int head_size);
// dqkv_full [N, 3 NH HS] -> dq [N, NH HS], dk and dv [N, KV HS] (overwritten), dk and dv summed over each group in
// acc_t<S>.
template <typename S>
void gqa_reduce(S* dq, S* dk, S* dv, const S* dqkv_full, int64_t N, int n_head, int n_kv_head, int head_size);

}  // namespace mt::kernels::cpu
