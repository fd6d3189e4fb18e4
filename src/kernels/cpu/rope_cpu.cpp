// CPU rotary position embeddings: a table of cos and sin per (position, frequency), computed in double and rounded
// to the accumulation type A, then rows in parallel, each head's two halves rotated by a unit-stride vector loop
// over the table row. The table depends only on (T, head_size, theta, pos_offset), which stay the same from step to
// step, so each thread keeps its last one: steady-state steps compute no trigonometry and allocate nothing.
#include "kernels/cpu/rope_cpu.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/rope.h"

namespace mt::kernels::cpu {
namespace {

// cos and sin for positions pos_offset .. pos_offset + T - 1: row t is cos[half] then sin[half].
template <typename A>
const A* angle_table(int64_t T, int64_t head_size, double theta, int64_t pos_offset) {
  struct Cache {
    int64_t T = -1, head_size = -1, pos_offset = -1;
    double theta = 0;
    std::vector<A> cs;
  };
  thread_local Cache cache;
  if (cache.T == T && cache.head_size == head_size && cache.theta == theta && cache.pos_offset == pos_offset)
    return cache.cs.data();
  const int64_t half = head_size / 2;
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = rope_inv_freq(theta, head_size, i);
  cache.cs.resize(size_t(T * 2 * half));
  A* cs = cache.cs.data();
  // An entry (two double-precision trigonometric calls) costs about as much as 16 elements of an elementwise op.
#pragma omp parallel for schedule(static) if (T * half > kParallelGrain / 16)
  for (int64_t t = 0; t < T; ++t) {
    const double pos = double(pos_offset + t);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = pos * inv_freq[i];
      cs[t * 2 * half + i] = A(std::cos(angle));
      cs[t * 2 * half + half + i] = A(std::sin(angle));
    }
  }
  cache.T = T, cache.head_size = head_size, cache.theta = theta, cache.pos_offset = pos_offset;
  return cs;
}

}  // namespace

template <typename S>
void rope_rotate(S* x, int64_t N, int64_t W, int64_t T, int64_t head_size, double theta, int64_t col_begin,
                 int64_t col_end, int64_t pos_offset, bool inverse) {
  using A = acc_t<S>;
  if (N == 0 || col_begin == col_end) return;
  const A* table = angle_table<A>(T, head_size, theta, pos_offset);
  const int64_t half = head_size / 2, heads = (col_end - col_begin) / head_size;
  const A sign = inverse ? A(-1) : A(1);  // the transpose rotates by -angle: sin negated (exactly)
#pragma omp parallel for schedule(static) if (N * (col_end - col_begin) > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const A* cos_t = table + (n % T) * 2 * half;
    const A* sin_t = cos_t + half;
    for (int64_t h = 0; h < heads; ++h) {
      S* lo = x + n * W + col_begin + h * head_size;
      S* hi = lo + half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const A a = load(lo[i]), b = load(hi[i]), c = cos_t[i], s = sign * sin_t[i];
        store(lo[i], a * c - b * s);
        store(hi[i], b * c + a * s);
      }
    }
  }
}

#define MT_ROPE_INSTANTIATE(S) \
  template void rope_rotate<S>(S*, int64_t, int64_t, int64_t, int64_t, double, int64_t, int64_t, int64_t, bool);
MT_ROPE_INSTANTIATE(float)
MT_ROPE_INSTANTIATE(double)
MT_ROPE_INSTANTIATE(bf16)
MT_ROPE_INSTANTIATE(fp16)
#undef MT_ROPE_INSTANTIATE

}  // namespace mt::kernels::cpu
