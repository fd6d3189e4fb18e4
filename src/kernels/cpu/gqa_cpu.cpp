// CPU grouped-query attention expansion and reduction: rows split across OpenMP threads. The expansion copies whole
// heads (element copies, exact in every dtype); the reduction sums each group's heads element by element in acc_t
// and rounds once, with a unit-stride vector loop over the head's elements.
#include "kernels/cpu/gqa_cpu.h"

#include <algorithm>

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {

template <typename S>
void gqa_expand(S* qkv_full, const S* q, const S* k, const S* v, int64_t N, int n_head, int n_kv_head, int head_size) {
  const int64_t HS = head_size, QW = int64_t(n_head) * HS, KW = int64_t(n_kv_head) * HS;
  const int group = n_head / n_kv_head;
#pragma omp parallel for schedule(static) if (N * 3 * QW > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    S* dst = qkv_full + n * 3 * QW;
    std::copy(q + n * QW, q + (n + 1) * QW, dst);  // q
    const S* kv_rows[2] = {k + n * KW, v + n * KW};
    for (int part = 0; part < 2; ++part) {  // k, then v
      const S* from = kv_rows[part];
      S* to = dst + (1 + part) * QW;
      for (int h = 0; h < n_head; ++h) std::copy(from + (h / group) * HS, from + (h / group + 1) * HS, to + h * HS);
    }
  }
}

template <typename S>
void gqa_reduce(S* dq, S* dk, S* dv, const S* dqkv_full, int64_t N, int n_head, int n_kv_head, int head_size) {
  using A = acc_t<S>;
  const int64_t HS = head_size, QW = int64_t(n_head) * HS, KW = int64_t(n_kv_head) * HS;
  const int group = n_head / n_kv_head;
#pragma omp parallel for schedule(static) if (N * 3 * QW > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const S* src = dqkv_full + n * 3 * QW;
    std::copy(src, src + QW, dq + n * QW);  // dq
    S* kv_rows[2] = {dk + n * KW, dv + n * KW};
    for (int part = 0; part < 2; ++part) {  // dk, then dv
      const S* from = src + (1 + part) * QW;
      S* to = kv_rows[part];
      for (int kv = 0; kv < n_kv_head; ++kv) {
        const S* heads = from + int64_t(kv) * group * HS;  // the group's query heads, consecutive
#pragma omp simd
        for (int64_t d = 0; d < HS; ++d) {
          A s = 0;
          for (int r = 0; r < group; ++r) s += load(heads[r * HS + d]);
          store(to[kv * HS + d], s);
        }
      }
    }
  }
}

#define MT_GQA_INSTANTIATE(S)                                                            \
  template void gqa_expand<S>(S*, const S*, const S*, const S*, int64_t, int, int, int); \
  template void gqa_reduce<S>(S*, S*, S*, const S*, int64_t, int, int, int);
MT_GQA_INSTANTIATE(float)
MT_GQA_INSTANTIATE(double)
MT_GQA_INSTANTIATE(bf16)
MT_GQA_INSTANTIATE(fp16)
#undef MT_GQA_INSTANTIATE

}  // namespace mt::kernels::cpu
