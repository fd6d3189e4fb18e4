// CPU rotary position embeddings (see kernels/rope.h for the contract). S is the storage type (float, double,
// bf16, fp16).
#pragma once
#include <cstdint>

#include "kernels/cpu/storage.h"

namespace mt::kernels::cpu {

// x [N, W] rotated in place over columns [col_begin, col_end) by +angle (inverse = false: the forward pass) or
// -angle (inverse = true: the backward pass, the transpose).
template <typename S>
void rope_rotate(S* x, int64_t N, int64_t W, int64_t T, int64_t head_size, double theta, int64_t col_begin,
                 int64_t col_end, int64_t pos_offset, bool inverse);

}  // namespace mt::kernels::cpu
