// GPU rotary position embeddings (kernels/rope.h). A thread owns one (position t, frequency i) pair: it computes
// the angle, its cos and sin in double once (as the CPU's table: inv_freq comes from the host's rope_inv_freq, the
// product and the trigonometry are double, within 2 ulp of the CPU's before both round to A), then rotates that
// pair of elements in every (sequence, head) of its share; blockIdx.y splits the (sequence, head) pairs so short
// sequences still fill the GPU. Consecutive threads take consecutive i, so a warp reads contiguous half-heads.
// Each element is read and written by one thread only (in place, no synchronisation).
#include "kernels/cuda/rope_cuda.h"

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/rope.h"

namespace mt::kernels::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHalf = 256;            // head_size <= 512: the frequencies travel as a 2 KiB kernel argument
constexpr int64_t kTargetBlocks = 2048;  // enough blocks to fill any current GPU several times over

struct InvFreq {
  double v[kMaxHalf];
};

__device__ __forceinline__ void sincos_acc(double a, float& s, float& c) {
  double sd, cd;
  sincos(a, &sd, &cd);
  s = static_cast<float>(sd), c = static_cast<float>(cd);  // rounded to nearest, as the CPU's conversion
}
__device__ __forceinline__ void sincos_acc(double a, double& s, double& c) { sincos(a, &s, &c); }

template <typename S>
__global__ void rope_kernel(S* x, int64_t T, int64_t W, int64_t col_begin, int head_size, int heads, int64_t seqs,
                            int64_t pos_offset, InvFreq inv_freq, bool inverse) {
  using A = acc_t<S>;
  const int half = head_size / 2;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (tid >= T * half) return;
  const int64_t t = tid / half;
  const int i = static_cast<int>(tid % half);
  A s, c;
  sincos_acc(double(pos_offset + t) * inv_freq.v[i], s, c);
  if (inverse) s = -s;  // the transpose rotates by -angle
  for (int64_t sh = blockIdx.y; sh < seqs * heads; sh += gridDim.y) {
    const int64_t b = sh / heads, h = sh % heads;
    S* lo = x + (b * T + t) * W + col_begin + h * head_size + i;
    S* hi = lo + half;
    const A a = to_acc(*lo), bb = to_acc(*hi);
    *lo = from_acc<S>(a * c - bb * s);
    *hi = from_acc<S>(bb * c + a * s);
  }
}

}  // namespace

void rope_rotate(const Tensor& x, int64_t T, int64_t head_size, double theta, int64_t col_begin, int64_t col_end,
                 int64_t pos_offset, bool inverse) {
  MT_CHECK(head_size / 2 <= kMaxHalf, "rope (cuda): head_size = {} exceeds {}", head_size, 2 * kMaxHalf);
  const int64_t W = x.dim(-1), N = x.numel() / W, heads = (col_end - col_begin) / head_size, half = head_size / 2;
  if (N == 0 || heads == 0) return;
  InvFreq inv_freq{};
  for (int64_t i = 0; i < half; ++i) inv_freq.v[i] = rope_inv_freq(theta, head_size, i);
  const int64_t seqs = N / T;
  const int64_t blocks_x = (T * half + kThreads - 1) / kThreads;
  const int64_t blocks_y = std::min<int64_t>({seqs * heads, 65535, std::max<int64_t>(1, kTargetBlocks / blocks_x)});
  MT_CHECK(blocks_x <= INT32_MAX, "rope (cuda): T * head_size / 2 = {} is too large", T * half);
  const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(blocks_y));
  dispatch_dtype(x.dtype(), [&](auto s) {
    using S = decltype(s);
    rope_kernel<S><<<grid, kThreads, 0, compute_stream()>>>(ptr<S>(x), T, W, col_begin, static_cast<int>(head_size),
                                                            static_cast<int>(heads), seqs, pos_offset, inv_freq,
                                                            inverse);
    CUDA_LAUNCH_CHECK();
  });
}

}  // namespace mt::kernels::gpu
