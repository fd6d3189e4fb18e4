// CPU LayerNorm: rows in parallel for the forward pass and for dinp; the parameter gradients in a second pass
// where each thread owns a block of columns, so they need no per-thread buffers and sum in a fixed order.
// The 16-bit kernels widen each row into per-thread fp32 buffers and run the fp32 row code on it, so their
// statistics are the fp32 kernel's on the same values and each output element is rounded once.
#include "kernels/cpu/layernorm_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {
namespace {
// One row in the arithmetic type T: y = (x - mean) * rstd * weight + bias.
template <typename T>
inline void forward_row(T* y, T& mean, T& rstd, const T* x, const T* weight, const T* bias, int64_t C, double eps) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < C; ++c) s += x[c];
  const T m = s / T(C);
  T v = 0;  // two passes over a row that sits in L1: no cancellation from E[x^2] - E[x]^2
#pragma omp simd reduction(+ : v)
  for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
  const T r = T(1) / std::sqrt(v / T(C) + T(eps));
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * r * weight[c] + bias[c];
  mean = m;
  rstd = r;
}

// One row of dx += rstd * (g - mean(g) - xhat * mean(g * xhat)), with g = dout * weight.
template <typename T>
inline void backward_row(T* dx, const T* dy, const T* x, const T* weight, T m, T r, int64_t C) {
  T sg = 0, sgx = 0;
#pragma omp simd reduction(+ : sg, sgx)
  for (int64_t c = 0; c < C; ++c) {
    const T g = dy[c] * weight[c];
    sg += g;
    sgx += g * (x[c] - m) * r;
  }
  const T mg = sg / T(C), mgx = sgx / T(C);
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) dx[c] += r * (dy[c] * weight[c] - mg - (x[c] - m) * r * mgx);
}
}  // namespace

template <typename S>
void layernorm_forward(S* out, acc_t<S>* mean, acc_t<S>* rstd, const S* inp, const S* weight, const S* bias,
                       int64_t N, int64_t C, double eps) {
  if constexpr (!is_16bit<S>) {
#pragma omp parallel for schedule(static) if (N * C > kParallelGrain)
    for (int64_t n = 0; n < N; ++n) forward_row(out + n * C, mean[n], rstd[n], inp + n * C, weight, bias, C, eps);
  } else {
    float* w = thread_scratch<0>(2 * C);
    widen(w, weight, C), widen(w + C, bias, C);
#pragma omp parallel if (N * C > kParallelGrain)
    {
      float* x = thread_scratch<1>(2 * C);
      float* y = x + C;
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        widen(x, inp + n * C, C);
        forward_row(y, mean[n], rstd[n], x, w, w + C, C, eps);
        for (int64_t c = 0; c < C; ++c) store(out[n * C + c], y[c]);
      }
    }
  }
}

template <typename S>
void layernorm_backward(S* dinp, acc_t<S>* dweight, acc_t<S>* dbias, const S* dout, const S* inp, const S* weight,
                        const acc_t<S>* mean, const acc_t<S>* rstd, int64_t N, int64_t C) {
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
        backward_row(dinp + n * C, dout + n * C, inp + n * C, weight, mean[n], rstd[n], C);
      } else {
        float *dy = buf, *x = buf + C, *dx = buf + 2 * C;
        widen(dy, dout + n * C, C), widen(x, inp + n * C, C), widen(dx, dinp + n * C, C);
        backward_row(dx, dy, x, w16, mean[n], rstd[n], C);
        for (int64_t c = 0; c < C; ++c) store(dinp[n * C + c], dx[c]);  // dinp += ..., rounded once
      }
    }
    // dweight += sum_n dout * xhat, dbias += sum_n dout: column blocks, rows walked in order. Per element the
    // same operations as the fp32 kernel on widened values (the vector lanes are columns, not a reduction).
    constexpr int64_t kBlock = 64;
    const int64_t nblocks = (C + kBlock - 1) / kBlock;
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const int64_t c0 = blk * kBlock, w = std::min(C, c0 + kBlock) - c0;
      A aw[kBlock] = {}, ab[kBlock] = {};
      for (int64_t n = 0; n < N; ++n) {
        const S* dy = dout + n * C + c0;
        const S* x = inp + n * C + c0;
        const A m = mean[n], r = rstd[n];
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) {
          aw[c] += load(dy[c]) * (load(x[c]) - m) * r;
          ab[c] += load(dy[c]);
        }
      }
      for (int64_t c = 0; c < w; ++c) {
        dweight[c0 + c] += aw[c];
        dbias[c0 + c] += ab[c];
      }
    }
  }
}

#define MT_LAYERNORM_INSTANTIATE(S)                                                                              \
  template void layernorm_forward<S>(S*, acc_t<S>*, acc_t<S>*, const S*, const S*, const S*, int64_t, int64_t, \
                                     double);                                                                  \
  template void layernorm_backward<S>(S*, acc_t<S>*, acc_t<S>*, const S*, const S*, const S*, const acc_t<S>*, \
                                      const acc_t<S>*, int64_t, int64_t);
MT_LAYERNORM_INSTANTIATE(float)
MT_LAYERNORM_INSTANTIATE(double)
MT_LAYERNORM_INSTANTIATE(bf16)
MT_LAYERNORM_INSTANTIATE(fp16)
#undef MT_LAYERNORM_INSTANTIATE

}  // namespace mt::kernels::cpu
