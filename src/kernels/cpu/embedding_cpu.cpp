// CPU embedding. The backward pass splits the channels among threads (each walks every token over its own
// columns), so repeated token ids never race and the sums happen in a fixed order (deterministic). Values are
// widened with load() and summed in the accumulation type; a forward output is rounded once.
#include "kernels/cpu/embedding_cpu.h"

#include <algorithm>

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {

template <typename S>
void embedding_forward(S* out, const int32_t* tokens, const S* wte, const S* wpe, int64_t B, int64_t T_,
                       int64_t C, int64_t v0, int64_t rows) {
#pragma omp parallel for schedule(static) if (B * T_ * C > kParallelGrain)
  for (int64_t bt = 0; bt < B * T_; ++bt) {
    const int64_t row = int64_t(tokens[bt]) - v0;
    S* o = out + bt * C;  // a single table's row is copied exactly, a sum rounded once
    if (row < 0 || row >= rows) {
      if (wpe) {
        const S* p = wpe + (bt % T_) * C;
        for (int64_t c = 0; c < C; ++c) o[c] = p[c];
      } else {
        for (int64_t c = 0; c < C; ++c) store(o[c], acc_t<S>(0));
      }
      continue;
    }
    const S* e = wte + row * C;
    if (wpe) {
      const S* p = wpe + (bt % T_) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) store(o[c], load(e[c]) + load(p[c]));
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = e[c];
    }
  }
}

template <typename S>
void embedding_backward(acc_t<S>* dwte, acc_t<S>* dwpe, const S* dout, const int32_t* tokens, int64_t B, int64_t T_,
                        int64_t C, int64_t v0, int64_t rows) {
  using A = acc_t<S>;
  constexpr int64_t kBlock = 64;
  const int64_t nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (B * T_ * C > kParallelGrain)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t c0 = blk * kBlock, w = std::min(C, c0 + kBlock) - c0;
    for (int64_t bt = 0; bt < B * T_; ++bt) {
      const S* g = dout + bt * C + c0;
      const int64_t row = int64_t(tokens[bt]) - v0;
      const bool own = row >= 0 && row < rows;
      if (own && dwpe) {
        A* e = dwte + row * C + c0;
        A* p = dwpe + (bt % T_) * C + c0;
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) {
          e[c] += load(g[c]);
          p[c] += load(g[c]);
        }
      } else if (own) {
        A* e = dwte + row * C + c0;
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) e[c] += load(g[c]);
      } else if (dwpe) {
        A* p = dwpe + (bt % T_) * C + c0;
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) p[c] += load(g[c]);
      }
    }
  }
}

#define MT_EMBEDDING_INSTANTIATE(S)                                                                           \
  template void embedding_forward<S>(S*, const int32_t*, const S*, const S*, int64_t, int64_t, int64_t, int64_t, \
                                     int64_t);                                                                 \
  template void embedding_backward<S>(acc_t<S>*, acc_t<S>*, const S*, const int32_t*, int64_t, int64_t, int64_t, \
                                      int64_t, int64_t);
MT_EMBEDDING_INSTANTIATE(float)
MT_EMBEDDING_INSTANTIATE(double)
MT_EMBEDDING_INSTANTIATE(bf16)
MT_EMBEDDING_INSTANTIATE(fp16)
#undef MT_EMBEDDING_INSTANTIATE

}  // namespace mt::kernels::cpu
