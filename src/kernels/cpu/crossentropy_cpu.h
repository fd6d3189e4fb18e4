// CPU fused softmax + cross-entropy over padded logits (see kernels/crossentropy.h).
#pragma once
#include <cstdint>

#include "kernels/cpu/storage.h"

namespace mt::kernels::cpu {

// logits/dlogits [N, Vp] of storage type S (dlogits may be null, or alias logits); losses [N] of type L:
// acc_t<S> (fp32 for 16-bit S), or for fp32/fp64 S either float or double.
template <typename S, typename L>
void softmax_xent_forward_backward(L* losses, S* dlogits, const S* logits, const int32_t* targets, int64_t N,
                                   int64_t Vp, int64_t vocab, double dloss);

}  // namespace mt::kernels::cpu
