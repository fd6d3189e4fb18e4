// Fused softmax + cross-entropy over logits whose last dimension is padded: only the first `vocab` columns are
// real tokens; padding columns get probability 0 and gradient 0, so padding never changes the loss.
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

// losses[N] = -log softmax(logits[n, :vocab])[targets[n]]     (overwritten)
// If dlogits is defined: dlogits[n, :] = (softmax - onehot(target)) * dloss (overwritten; padding columns 0).
// dlogits may alias logits (the gradient replaces the logits in place, as llm.c does).
// targets is int32 [N]; each target must be < vocab.
// Dtypes: logits and dlogits S (fp32, fp64, bf16 or fp16); losses in the accumulation dtype acc_dtype(S) (fp32 for
// bf16 and fp16; fp32 or fp64 for fp32 and fp64 logits). Softmax and loss are computed in fp32 (fp64 for fp64
// logits) from the stored logits; with 16-bit S only the gradient is rounded, once per element.
void softmax_xent_forward_backward(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                   const Tensor& targets, int64_t vocab, double dloss);

}  // namespace mt::kernels
