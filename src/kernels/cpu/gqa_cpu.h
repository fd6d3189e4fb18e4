// CPU grouped-query attention expansion and its transpose, see kernels/gqa.h. S is the storage type (float, double,
// bf16, fp16).
#pragma once
#include <cstdint>

#include "kernels/cpu/storage.h"

namespace mt::kernels::cpu {

// qkv [N, (NH + 2 KV) HS] -> qkv_full [N, 3 NH HS] (overwritten).
template <typename S>
void gqa_expand(S* qkv_full, const S* qkv, int64_t N, int n_head, int n_kv_head, int head_size);
// dqkv_full [N, 3 NH HS] -> dqkv [N, (NH + 2 KV) HS] (overwritten), dk and dv summed over each group in acc_t<S>.
template <typename S>
void gqa_reduce(S* dqkv, const S* dqkv_full, int64_t N, int n_head, int n_kv_head, int head_size);

}  // namespace mt::kernels::cpu
