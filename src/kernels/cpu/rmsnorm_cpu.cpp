// CPU RMSNorm, laid out as the CPU LayerNorm (layernorm_cpu.cpp): rows in parallel for the forward pass and for
// dinp; the weight gradient in a second pass where each thread owns a block of columns, so it needs no per-thread
// buffers and sums in a fixed order. The 16-bit kernels widen each row into per-thread fp32 buffers and run the
// fp32 row code on it, so their rstd is the fp32 kernel's on the same values and each output is rounded once.
#include "kernels/cpu/rmsnorm_cpu.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {
namespace {
// One row in the arithmetic type T: y = x * rstd * weight.
template <typename T>
inline void forward_row(T* y, T& rstd, const T* x, const T* weight, int64_t C, double eps) {
  T ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int64_t c = 0; c < C; ++c) ss += x[c] * x[c];
  const T r = T(1) / std::sqrt(ss / T(C) + T(eps));
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) y[c] = x[c] * r * weight[c];
  rstd = r;
}

// One row of dx += rstd * (g - xhat * mean(g * xhat)), g = dout * weight, xhat = x * rstd: the derivative of
// x_c * r through r = (mean(x^2) + eps)^(-1/2) is dr/dx_c = -r^3 x_c / C.
template <typename T>
inline void backward_row(T* dx, const T* dy, const T* x, const T* weight, T r, int64_t C) {
  T sgx = 0;
#pragma omp simd reduction(+ : sgx)
  for (int64_t c = 0; c < C; ++c) sgx += dy[c] * weight[c] * x[c] * r;
  const T mgx = sgx / T(C);
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) dx[c] += r * (dy[c] * weight[c] - x[c] * r * mgx);
}
}  // namespace

template <typename S>
void rmsnorm_forward(S* out, acc_t<S>* rstd, const S* inp, const S* weight, int64_t N, int64_t C, double eps) {
  if constexpr (!is_16bit<S>) {
#pragma omp parallel for schedule(static) if (N * C > kParallelGrain)
    for (int64_t n = 0; n < N; ++n) forward_row(out + n * C, rstd[n], inp + n * C, weight, C, eps);
  } else {
    float* w = thread_scratch<0>(C);
    widen(w, weight, C);
#pragma omp parallel if (N * C > kParallelGrain)
    {
      float* x = thread_scratch<1>(2 * C);
      float* y = x + C;
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        widen(x, inp + n * C, C);
        forward_row(y, rstd[n], x, w, C, eps);
        for (int64_t c = 0; c < C; ++c) store(out[n * C + c], y[c]);
      }
    }
  }
}

template <typename S>
void rmsnorm_backward(S* dinp, acc_t<S>* dweight, const S* dout, const S* inp, const S* weight,
                      const acc_t<S>* rstd, int64_t N, int64_t C) {
  using A = acc_t<S>;
  const float* w16 = nullptr;  // the 16-bit weight, widened
  if constexpr (is_16bit<S>) {
    float* w = thread_scratch<0>(C);
    widen(w, weight, C);
    w16 = w;
  }
#pragma omp parallel if (N * C > kParallelGrain)
  {
    float* buf = is_16bit<S> ? thread_scratch<1>(3 * C) : nullptr;  // dy, x, dx rows of a 16-bit kernel
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      if constexpr (!is_16bit<S>) {
        backward_row(dinp + n * C, dout + n * C, inp + n * C, weight, rstd[n], C);
      } else {
        float *dy = buf, *x = buf + C, *dx = buf + 2 * C;
        widen(dy, dout + n * C, C), widen(x, inp + n * C, C), widen(dx, dinp + n * C, C);
        backward_row(dx, dy, x, w16, rstd[n], C);
        for (int64_t c = 0; c < C; ++c) store(dinp[n * C + c], dx[c]);  // dinp += ..., rounded once
      }
    }
    // dweight += sum_n dout * xhat: column blocks, rows walked in order (the vector lanes are columns).
    constexpr int64_t kBlock = 64;
    const int64_t nblocks = (C + kBlock - 1) / kBlock;
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const int64_t c0 = blk * kBlock, w = std::min(C, c0 + kBlock) - c0;
      A aw[kBlock] = {};
      for (int64_t n = 0; n < N; ++n) {
        const S* dy = dout + n * C + c0;
        const S* x = inp + n * C + c0;
        const A r = rstd[n];
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) aw[c] += load(dy[c]) * load(x[c]) * r;
      }
      for (int64_t c = 0; c < w; ++c) dweight[c0 + c] += aw[c];
    }
  }
}

#define MT_RMSNORM_INSTANTIATE(S)                                                                  \
  template void rmsnorm_forward<S>(S*, acc_t<S>*, const S*, const S*, int64_t, int64_t, double); \
  template void rmsnorm_backward<S>(S*, acc_t<S>*, const S*, const S*, const S*, const acc_t<S>*, int64_t, int64_t);
MT_RMSNORM_INSTANTIATE(float)
MT_RMSNORM_INSTANTIATE(double)
MT_RMSNORM_INSTANTIATE(bf16)
MT_RMSNORM_INSTANTIATE(fp16)
#undef MT_RMSNORM_INSTANTIATE

}  // namespace mt::kernels::cpu
