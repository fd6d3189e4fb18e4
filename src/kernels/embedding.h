// Token + position embedding, forward and backward.
// Dtypes: tokens int32; wte, wpe and out share the activation dtype S (fp32, fp64, bf16 or fp16); in the
// backward pass dout is S and dwte, dwpe are in its accumulation dtype A (fp64 for fp64, else fp32). The
// token + position sum is formed in A and rounded once.
#pragma once
#include "core/tensor.h"

namespace mt::kernels {

// out[B, T, C] = wte[tokens[b, t]] + wpe[t]. tokens is int32 [B, T]; wte is [Vp, C], wpe is [maxT, C].
// Vocabulary-parallel form: wte holds the rows [v0, v0 + rows) of the vocabulary; a token outside that range
// contributes zero (another tp rank holds its row). vocab_bound > 0 is the range token ids must lie in (the global
// padded vocabulary); the default (-1) means [0, v0 + rows). wpe may be undefined: no position term (tensor
// parallelism adds it once, after the all-reduce of the token rows).
void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       int64_t v0 = 0, int64_t vocab_bound = -1);

// dwte[tokens[b, t] - v0] += dout[b, t] for tokens in [v0, v0 + rows); dwpe[t] += sum_b dout[b, t] (both
// accumulated; dwpe may be undefined: skipped). v0 and vocab_bound as in embedding_forward.
void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,
                        int64_t v0 = 0, int64_t vocab_bound = -1);

}  // namespace mt::kernels
