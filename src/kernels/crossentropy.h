// Fused softmax + cross-entropy over logits whose last dimension is padded: only the first `vocab` columns are
// real tokens; padding columns get probability 0 and gradient 0, so padding never changes the loss.
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

// losses[N] = -log softmax(logits[n, :vocab])[targets[n]]     (overwritten; losses is fp32 or fp64)
// If dlogits is defined: dlogits[n, :] = (softmax - onehot(target)) * dloss (overwritten; padding columns 0).
// dlogits may alias logits (the gradient replaces the logits in place, as llm.c does).
// targets is int32 [N]; each target must be < vocab.
void softmax_xent_forward_backward(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                   const Tensor& targets, int64_t vocab, double dloss);

}  // namespace mt::kernels
