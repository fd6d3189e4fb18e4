// CPU SwiGLU: rows split across OpenMP threads, each row's gate and up halves processed as Eigen array expressions
// (Eigen's vectorised exp: a few ulp in fp32). The 16-bit kernels widen a row into a per-thread fp32 buffer, run
// the fp32 row code on it and round each output once.
#include "kernels/cpu/swiglu_cpu.h"

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {
namespace {

// y = silu(g) * u = g / (1 + exp(-g)) * u. A very negative g gives exp(-g) = inf and y = -0, not NaN.
template <typename T>
void forward_row(T* out, const T* gate, const T* up, int64_t H) {
  CArrMap<T> g(gate, H), u(up, H);
  ArrMap<T> y(out, H);
  y = g / (T(1) + (-g).exp()) * u;
}

// With s = sigmoid(g): d silu / dg = s + g s (1 - s) = s (1 + g (1 - s)). s is formed once in dgate's place,
// then dup and dgate are computed from it (elementwise, so dgate may be updated in place).
template <typename T>
void backward_row(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t H) {
  CArrMap<T> g(gate, H), u(up, H), dy(dout, H);
  ArrMap<T> dg(dgate, H), du(dup, H);
  dg = T(1) / (T(1) + (-g).exp());
  du = dy * g * dg;
  dg = dy * u * dg * (T(1) + g * (T(1) - dg));
}

}  // namespace

template <typename S>
void swiglu_forward(S* out, const S* inp, int64_t N, int64_t H) {
#pragma omp parallel if (N * H > kParallelGrain)
  {
    float* buf = is_16bit<S> ? thread_scratch<0>(3 * H) : nullptr;  // gate, up, out rows of a 16-bit kernel
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const S* row = inp + n * 2 * H;
      if constexpr (!is_16bit<S>) {
        forward_row(out + n * H, row, row + H, H);
      } else {
        for (int64_t c = 0; c < 2 * H; ++c) buf[c] = load(row[c]);
        forward_row(buf + 2 * H, buf, buf + H, H);
        for (int64_t c = 0; c < H; ++c) store(out[n * H + c], buf[2 * H + c]);
      }
    }
  }
}

template <typename S>
void swiglu_backward(S* dinp, const S* dout, const S* inp, int64_t N, int64_t H) {
#pragma omp parallel if (N * H > kParallelGrain)
  {
    float* buf = is_16bit<S> ? thread_scratch<0>(5 * H) : nullptr;  // gate, up, dout, dgate, dup rows
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const S* row = inp + n * 2 * H;
      S* drow = dinp + n * 2 * H;
      if constexpr (!is_16bit<S>) {
        backward_row(drow, drow + H, dout + n * H, row, row + H, H);
      } else {
        for (int64_t c = 0; c < 2 * H; ++c) buf[c] = load(row[c]);
        for (int64_t c = 0; c < H; ++c) buf[2 * H + c] = load(dout[n * H + c]);
        backward_row(buf + 3 * H, buf + 4 * H, buf + 2 * H, buf, buf + H, H);
        for (int64_t c = 0; c < 2 * H; ++c) store(drow[c], buf[3 * H + c]);
      }
    }
  }
}

#define MT_SWIGLU_INSTANTIATE(S)                                   \
  template void swiglu_forward<S>(S*, const S*, int64_t, int64_t); \
  template void swiglu_backward<S>(S*, const S*, const S*, int64_t, int64_t);
MT_SWIGLU_INSTANTIATE(float)
MT_SWIGLU_INSTANTIATE(double)
MT_SWIGLU_INSTANTIATE(bf16)
MT_SWIGLU_INSTANTIATE(fp16)
#undef MT_SWIGLU_INSTANTIATE

}  // namespace mt::kernels::cpu
