// CPU vocab-parallel softmax + cross-entropy steps, one row per iteration, rows split across OpenMP threads. The
// per-row arithmetic is the unsharded kernel's (crossentropy_cpu.cpp) cut at the two reductions: Eigen's max and
// vectorised exp over the real columns only, then one scaling pass writing the gradient. Step 3 takes the target
// logit from the reduced stats rather than from the logits, so dlogits may overwrite logits in place.
// 16-bit storage (bf16, fp16): each row's real columns are first widened into a per-thread fp32 buffer and the
// fp32 code runs on it (every logit of the row is read before any dlogit is written); row_max, stats and losses
// are fp32, and each dlogit is rounded once.
#include "kernels/cpu/vocab_parallel_cpu.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {
namespace {
// 16-bit rows: the first nreal logits widened into the buffer.
template <typename S>
float* widen_row(const S* l, int64_t nreal) {
  float* buf = thread_scratch(nreal);
  for (int64_t j = 0; j < nreal; ++j) buf[j] = load(l[j]);
  return buf;
}

// The first nreal logits of a row in acc_t<S>: the row itself for fp32/fp64, else widened into the buffer.
template <typename S>
const acc_t<S>* widened(const S* l, int64_t nreal) {
  if constexpr (is_16bit<S>) return widen_row(l, nreal);
  else return l;
}
}  // namespace

template <typename S>
void vocab_parallel_xent_local_max(acc_t<S>* row_max, const S* logits, int64_t N, int64_t Vl, int64_t nreal) {
  using A = acc_t<S>;
  if (nreal == 0) {
    for (int64_t n = 0; n < N; ++n) row_max[n] = -std::numeric_limits<A>::infinity();
    return;
  }
#pragma omp parallel for schedule(static) if (N * nreal > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) row_max[n] = CArrMap<A>(widened(logits + n * Vl, nreal), nreal).maxCoeff();
}

template <typename S>
void vocab_parallel_xent_local_sums(acc_t<S>* stats, const S* logits, const int32_t* targets,
                                    const acc_t<S>* row_max, int64_t N, int64_t Vl, int64_t v0, int64_t nreal) {
  using A = acc_t<S>;
  A* sum_exp = stats;
  A* target_logit = stats + N;
#pragma omp parallel for schedule(static) if (N * nreal > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const S* l = logits + n * Vl;
    sum_exp[n] = nreal > 0 ? (CArrMap<A>(widened(l, nreal), nreal) - row_max[n]).exp().sum() : A(0);
    const int64_t j = int64_t(targets[n]) - v0;  // targets < vocab, so an owned target is a real column
    target_logit[n] = (j >= 0 && j < nreal) ? load(l[j]) : A(0);
  }
}

template <typename S, typename L>
void vocab_parallel_xent_finish(L* losses, S* dlogits, const S* logits, const int32_t* targets,
                                const acc_t<S>* row_max, const acc_t<S>* stats, int64_t N, int64_t Vl, int64_t v0,
                                int64_t nreal, double dloss) {
  using A = acc_t<S>;
  const A* sum_exp = stats;
  const A* target_logit = stats + N;
#pragma omp parallel for schedule(static) if (dlogits && N * Vl > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const A mx = row_max[n];
    const double sum = double(sum_exp[n]);
    losses[n] = L(std::log(sum) + double(mx) - double(target_logit[n]));
    if (!dlogits) continue;
    S* d = dlogits + n * Vl;
    if (nreal > 0) {
      // fp32/fp64: the gradient is computed straight into dlogits; 16-bit: in the widened buffer, then rounded.
      const A* src;
      A* dst;
      if constexpr (is_16bit<S>) src = dst = widen_row(logits + n * Vl, nreal);
      else src = logits + n * Vl, dst = d;
      ArrMap<A> dr(dst, nreal);
      dr = (CArrMap<A>(src, nreal) - mx).exp();  // elementwise: safe when dst aliases the logits
      dr *= A(dloss / sum);
      const int64_t j = int64_t(targets[n]) - v0;
      if (j >= 0 && j < nreal) dst[j] -= A(dloss);
      if constexpr (is_16bit<S>)
        for (int64_t v = 0; v < nreal; ++v) store(d[v], dst[v]);
    }
    for (int64_t v = nreal; v < Vl; ++v) store(d[v], A(0));
  }
}

#define MT_VOCAB_PARALLEL_INSTANTIATE(S)                                                                          \
  template void vocab_parallel_xent_local_max<S>(acc_t<S>*, const S*, int64_t, int64_t, int64_t);                \
  template void vocab_parallel_xent_local_sums<S>(acc_t<S>*, const S*, const int32_t*, const acc_t<S>*, int64_t, \
                                                  int64_t, int64_t, int64_t);
#define MT_VOCAB_PARALLEL_FINISH(S, L)                                                                          \
  template void vocab_parallel_xent_finish<S, L>(L*, S*, const S*, const int32_t*, const acc_t<S>*,            \
                                                 const acc_t<S>*, int64_t, int64_t, int64_t, int64_t, double);
MT_VOCAB_PARALLEL_INSTANTIATE(float)
MT_VOCAB_PARALLEL_INSTANTIATE(double)
MT_VOCAB_PARALLEL_INSTANTIATE(bf16)
MT_VOCAB_PARALLEL_INSTANTIATE(fp16)
MT_VOCAB_PARALLEL_FINISH(float, float)
MT_VOCAB_PARALLEL_FINISH(float, double)
MT_VOCAB_PARALLEL_FINISH(double, float)
MT_VOCAB_PARALLEL_FINISH(double, double)
MT_VOCAB_PARALLEL_FINISH(bf16, float)
MT_VOCAB_PARALLEL_FINISH(fp16, float)
#undef MT_VOCAB_PARALLEL_INSTANTIATE
#undef MT_VOCAB_PARALLEL_FINISH

}  // namespace mt::kernels::cpu
