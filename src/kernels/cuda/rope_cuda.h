// GPU rotary position embeddings (kernels/rope.h): declarations only, without CUDA headers, so every build can
// include them. The entry points in kernels/rope.cpp check the arguments.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mt::kernels::gpu {

// x [N, W] rotated in place over columns [col_begin, col_end) by +angle, or by -angle when inverse (the backward
// pass). head_size at most 512.
void rope_rotate(const Tensor& x, int64_t T, int64_t head_size, double theta, int64_t col_begin, int64_t col_end,
                 int64_t pos_offset, bool inverse);

}  // namespace mt::kernels::gpu
