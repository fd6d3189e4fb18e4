// Rotary position embeddings (RoPE) in the half-split layout of Llama checkpoints: element i of a head of HS
// elements pairs with element i + HS/2 (not with its neighbour i + 1), rotated by the angle
// pos * inv_freq[i] with inv_freq[i] = theta^(-2i / HS) for i < HS/2:
//   x'[i]        = x[i] * cos - x[i + HS/2] * sin
//   x'[i + HS/2] = x[i + HS/2] * cos + x[i] * sin
// The ops work in place on a column range of a row-major [N, W] tensor (the q and k parts of a fused qkv
// projection's output [B, T, W]): rows are the flattened (b, t), and a row's position is pos_offset + row % T.
// Angles: inv_freq, pos * inv_freq and its cos and sin are computed in double for every dtype, and cos and sin are
// then rounded to the accumulation dtype A (fp64 for fp64, else fp32), so a position of 1e5 rotates as accurately
// as position 1 (an angle formed in fp32 would be off by ~1e-2 rad there). The rotation itself is computed in A;
// each S element is rounded once. The GPU computes the same double angles, so its results match the CPU's to a
// few ulp of A (there head_size is at most 512). Dtypes: fp32, fp64, bf16 or fp16.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/tensor.h"

namespace mt::kernels {

// Llama's default base.
constexpr double kRopeTheta = 10000.0;

// inv_freq[i] = theta^(-2i / HS), in double: the one definition both devices use.
inline double rope_inv_freq(double theta, int64_t head_size, int64_t i) {
  return std::pow(theta, -2.0 * double(i) / double(head_size));
}

// x [..., W] (N rows of W) rotated in place over columns [col_begin, col_end), which hold whole heads of head_size
// (even) elements; the other columns are untouched. N must be a multiple of T (whole sequences); pos_offset >= 0 is
// added to every position (a continuation that starts after pos_offset earlier tokens); theta > 0.
void rope_forward(const Tensor& x, int64_t T, int64_t head_size, double theta, int64_t col_begin, int64_t col_end,
                  int64_t pos_offset = 0);

// The gradient through rope_forward, in place over dx (same arguments): the transpose of the rotation, a rotation
// by -angle, which is also its inverse (rope_backward(rope_forward(x)) == x up to rounding).
void rope_backward(const Tensor& dx, int64_t T, int64_t head_size, double theta, int64_t col_begin, int64_t col_end,
                   int64_t pos_offset = 0);

}  // namespace mt::kernels
