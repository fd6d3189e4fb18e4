// CPU vocab-parallel softmax + cross-entropy steps (see kernels/vocab_parallel.h).
#pragma once
#include <cstdint>

namespace mt::kernels::cpu {

// All: logits/dlogits [N, Vl] row-major, of which the first nreal columns (0 <= nreal <= Vl) are real vocabulary
// and the rest padding; v0 is the global id of local column 0. row_max [N]; stats [2, N] (sum_exp, target_logit).
template <typename T>
void vocab_parallel_xent_local_max(T* row_max, const T* logits, int64_t N, int64_t Vl, int64_t nreal);

template <typename T>
void vocab_parallel_xent_local_sums(T* stats, const T* logits, const int32_t* targets, const T* row_max, int64_t N,
                                    int64_t Vl, int64_t v0, int64_t nreal);

// dlogits may be null (losses only), or alias logits. losses [N] of type L.
template <typename T, typename L>
void vocab_parallel_xent_finish(L* losses, T* dlogits, const T* logits, const int32_t* targets, const T* row_max,
                                const T* stats, int64_t N, int64_t Vl, int64_t v0, int64_t nreal, double dloss);

}  // namespace mt::kernels::cpu
