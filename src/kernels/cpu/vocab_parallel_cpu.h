// CPU vocab-parallel softmax + cross-entropy steps (see kernels/vocab_parallel.h).
#pragma once
#include <cstdint>

#include "kernels/cpu/storage.h"

namespace mt::kernels::cpu {

// All: logits/dlogits [N, Vl] row-major of storage type S, of which the first nreal columns (0 <= nreal <= Vl) are
// real vocabulary and the rest padding; v0 is the global id of local column 0. row_max [N] and stats [2, N]
// (sum_exp, target_logit) are in the accumulation type acc_t<S>.
template <typename S>
void vocab_parallel_xent_local_max(acc_t<S>* row_max, const S* logits, int64_t N, int64_t Vl, int64_t nreal);

template <typename S>
void vocab_parallel_xent_local_sums(acc_t<S>* stats, const S* logits, const int32_t* targets,
                                    const acc_t<S>* row_max, int64_t N, int64_t Vl, int64_t v0, int64_t nreal);

// dlogits may be null (losses only), or alias logits. losses [N] of type L: acc_t<S> (fp32 for 16-bit S), or for
// fp32/fp64 S either float or double.
template <typename S, typename L>
void vocab_parallel_xent_finish(L* losses, S* dlogits, const S* logits, const int32_t* targets,
                                const acc_t<S>* row_max, const acc_t<S>* stats, int64_t N, int64_t Vl, int64_t v0,
                                int64_t nreal, double dloss);

}  // namespace mt::kernels::cpu
