// CPU token + position embedding (see kernels/embedding.h).
#pragma once
#include <cstdint>

namespace mt::kernels::cpu {

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B, int64_t T_,
                       int64_t C, int64_t v0, int64_t rows);
// Both accumulated. wte holds vocabulary rows [v0, v0 + rows); other tokens are skipped. wpe/dwpe may be null.
template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B, int64_t T_, int64_t C,
                        int64_t v0, int64_t rows);

}  // namespace mt::kernels::cpu
