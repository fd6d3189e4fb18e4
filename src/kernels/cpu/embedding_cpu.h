// CPU token + position embedding (see kernels/embedding.h). S is the activation storage type (float, double,
// bf16, fp16); the table gradients are in its accumulation type acc_t<S>.
#pragma once
#include <cstdint>

#include "kernels/cpu/storage.h"

namespace mt::kernels::cpu {

template <typename S>
void embedding_forward(S* out, const int32_t* tokens, const S* wte, const S* wpe, int64_t B, int64_t T_,
                       int64_t C, int64_t v0, int64_t rows);
// Both accumulated. wte holds vocabulary rows [v0, v0 + rows); other tokens are skipped. wpe/dwpe may be null.
template <typename S>
void embedding_backward(acc_t<S>* dwte, acc_t<S>* dwpe, const S* dout, const int32_t* tokens, int64_t B, int64_t T_,
                        int64_t C, int64_t v0, int64_t rows);

}  // namespace mt::kernels::cpu
