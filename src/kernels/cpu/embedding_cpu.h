// CPU token + position embedding (see kernels/embedding.h).
#pragma once
#include <cstdint>

namespace mt::kernels::cpu {

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B, int64_t T_,
                       int64_t C);
// Both accumulated.
template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B, int64_t T_, int64_t C);

}  // namespace mt::kernels::cpu
