// CPU embedding. The backward pass splits the channels among threads (each walks every token over its own
// columns), so repeated token ids never race and the sums happen in a fixed order (deterministic).
#include "kernels/cpu/embedding_cpu.h"

#include <algorithm>

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B, int64_t T_,
                       int64_t C, int64_t v0, int64_t rows) {
#pragma omp parallel for schedule(static) if (B * T_ * C > kParallelGrain)
  for (int64_t bt = 0; bt < B * T_; ++bt) {
    const int64_t row = int64_t(tokens[bt]) - v0;
    T* o = out + bt * C;
    if (row < 0 || row >= rows) {
      if (wpe) {
        const T* p = wpe + (bt % T_) * C;
        for (int64_t c = 0; c < C; ++c) o[c] = p[c];
      } else {
        for (int64_t c = 0; c < C; ++c) o[c] = T(0);
      }
      continue;
    }
    const T* e = wte + row * C;
    if (wpe) {
      const T* p = wpe + (bt % T_) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = e[c];
    }
  }
}

template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B, int64_t T_, int64_t C,
                        int64_t v0, int64_t rows) {
  constexpr int64_t kBlock = 64;
  const int64_t nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (B * T_ * C > kParallelGrain)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t c0 = blk * kBlock, w = std::min(C, c0 + kBlock) - c0;
    for (int64_t bt = 0; bt < B * T_; ++bt) {
      const T* g = dout + bt * C + c0;
      const int64_t row = int64_t(tokens[bt]) - v0;
      const bool own = row >= 0 && row < rows;
      if (own && dwpe) {
        T* e = dwte + row * C + c0;
        T* p = dwpe + (bt % T_) * C + c0;
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) {
          e[c] += g[c];
          p[c] += g[c];
        }
      } else if (own) {
        T* e = dwte + row * C + c0;
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) e[c] += g[c];
      } else if (dwpe) {
        T* p = dwpe + (bt % T_) * C + c0;
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) p[c] += g[c];
      }
    }
  }
}

template void embedding_forward<float>(float*, const int32_t*, const float*, const float*, int64_t, int64_t,
                                       int64_t, int64_t, int64_t);
template void embedding_forward<double>(double*, const int32_t*, const double*, const double*, int64_t, int64_t,
                                        int64_t, int64_t, int64_t);
template void embedding_backward<float>(float*, float*, const float*, const int32_t*, int64_t, int64_t, int64_t,
                                        int64_t, int64_t);
template void embedding_backward<double>(double*, double*, const double*, const int32_t*, int64_t, int64_t,
                                         int64_t, int64_t, int64_t);

}  // namespace mt::kernels::cpu
