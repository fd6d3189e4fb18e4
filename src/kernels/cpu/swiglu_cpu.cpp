// CPU SwiGLU: the elements are split across OpenMP threads (parallel_ranges) and each thread's range is processed
// in chunks of kChunk elements: the chunk's inputs are loaded (widened, for 16-bit storage) into 64-byte aligned
// acc_t arrays on the stack, the formulas run there as Eigen array expressions (Eigen's vectorised exp: a few ulp
// in fp32), and the results are stored (each rounded once, for 16-bit storage). Every dtype takes this one path:
//  - all of a chunk's inputs are read before any of its outputs is written, which is what lets an output alias an
//    input (kernels/swiglu.h);
//  - a 16-bit kernel runs exactly the fp32 kernel's arithmetic on the widened values (the same chunk lengths and
//    alignment, so Eigen splits them into the same packets and scalar tail), so its outputs are the fp32 kernel's
//    rounded once, bit for bit.
// The copies in and out stay in L1 and cost little next to the exp.
#include "kernels/cpu/swiglu_cpu.h"

#include <algorithm>

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {
namespace {

// A multiple of 64, as are the lengths of parallel_ranges' thread ranges but the last: every chunk but the tensor's
// last is a whole number of packets, so where Eigen's scalar tail falls does not depend on the number of threads.
constexpr int64_t kChunk = 256;

// y = silu(g) * u = g / (1 + exp(-g)) * u, over m elements. A very negative g gives exp(-g) = inf and y = -0,
// not NaN.
template <typename A>
void forward_chunk(A* y, const A* g, const A* u, int64_t m) {
  CArrMap<A> ga(g, m), ua(u, m);
  ArrMap<A>(y, m) = ga / (A(1) + (-ga).exp()) * ua;
}

// With s = sigmoid(g): d silu / dg = s + g s (1 - s) = s (1 + g (1 - s)). s is formed once, in its own array;
// no two of these arrays alias (the caller's tensors may, which the copies in and out resolve).
template <typename A>
void backward_chunk(A* dg, A* du, A* s, const A* dy, const A* g, const A* u, int64_t m) {
  CArrMap<A> ga(g, m), ua(u, m), dya(dy, m);
  ArrMap<A> sa(s, m);
  sa = A(1) / (A(1) + (-ga).exp());
  ArrMap<A>(du, m) = dya * ga * sa;
  ArrMap<A>(dg, m) = dya * ua * sa * (A(1) + ga * (A(1) - sa));
}

}  // namespace

template <typename S>
void swiglu_forward(S* out, const S* gate, const S* up, int64_t n) {
  using A = acc_t<S>;
  parallel_ranges(n, [&](int64_t begin, int64_t end) {
    alignas(64) A g[kChunk], u[kChunk], y[kChunk];
    for (int64_t b = begin; b < end; b += kChunk) {
      const int64_t m = std::min(kChunk, end - b);
      for (int64_t i = 0; i < m; ++i) g[i] = load(gate[b + i]), u[i] = load(up[b + i]);
      forward_chunk(y, g, u, m);
      for (int64_t i = 0; i < m; ++i) store(out[b + i], y[i]);
    }
  });
}

template <typename S>
void swiglu_backward(S* dgate, S* dup, const S* dout, const S* gate, const S* up, int64_t n) {
  using A = acc_t<S>;
  parallel_ranges(n, [&](int64_t begin, int64_t end) {
    alignas(64) A g[kChunk], u[kChunk], dy[kChunk], s[kChunk], dg[kChunk], du[kChunk];
    for (int64_t b = begin; b < end; b += kChunk) {
      const int64_t m = std::min(kChunk, end - b);
      for (int64_t i = 0; i < m; ++i) g[i] = load(gate[b + i]), u[i] = load(up[b + i]), dy[i] = load(dout[b + i]);
      backward_chunk(dg, du, s, dy, g, u, m);
      for (int64_t i = 0; i < m; ++i) store(dgate[b + i], dg[i]), store(dup[b + i], du[i]);
    }
  });
}

#define MT_SWIGLU_INSTANTIATE(S)                                    \
  template void swiglu_forward<S>(S*, const S*, const S*, int64_t); \
  template void swiglu_backward<S>(S*, S*, const S*, const S*, const S*, int64_t);
MT_SWIGLU_INSTANTIATE(float)
MT_SWIGLU_INSTANTIATE(double)
MT_SWIGLU_INSTANTIATE(bf16)
MT_SWIGLU_INSTANTIATE(fp16)
#undef MT_SWIGLU_INSTANTIATE

}  // namespace mt::kernels::cpu
