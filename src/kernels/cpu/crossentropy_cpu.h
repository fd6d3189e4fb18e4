// CPU fused softmax + cross-entropy over padded logits (see kernels/crossentropy.h).
#pragma once
#include <cstdint>

namespace mt::kernels::cpu {

// logits/dlogits [N, Vp] (dlogits may be null, or alias logits); losses [N] of type L.
template <typename T, typename L>
void softmax_xent_forward_backward(L* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N,
                                   int64_t Vp, int64_t vocab, double dloss);

}  // namespace mt::kernels::cpu
