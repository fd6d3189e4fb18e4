// CPU LayerNorm: rows in parallel for the forward pass and for dinp; the parameter gradients in a second pass
// where each thread owns a block of columns, so they need no per-thread buffers and sum in a fixed order.
#include "kernels/cpu/layernorm_cpu.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int64_t N,
                       int64_t C, double eps) {
#pragma omp parallel for schedule(static) if (N * C > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T* y = out + n * C;
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
    mean[n] = m;
    rstd[n] = r;
  }
}

template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, int64_t N, int64_t C) {
  const bool par = N * C > kParallelGrain;
#pragma omp parallel if (par)
  {
    // dinp = rstd * (g - mean(g) - xhat * mean(g * xhat)), with g = dout * weight.
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* dy = dout + n * C;
      const T* x = inp + n * C;
      T* dx = dinp + n * C;
      const T m = mean[n], r = rstd[n];
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
    // dweight += sum_n dout * xhat, dbias += sum_n dout: column blocks, rows walked in order.
    constexpr int64_t kBlock = 64;
    const int64_t nblocks = (C + kBlock - 1) / kBlock;
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const int64_t c0 = blk * kBlock, w = std::min(C, c0 + kBlock) - c0;
      T aw[kBlock] = {}, ab[kBlock] = {};
      for (int64_t n = 0; n < N; ++n) {
        const T* dy = dout + n * C + c0;
        const T* x = inp + n * C + c0;
        const T m = mean[n], r = rstd[n];
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) {
          aw[c] += dy[c] * (x[c] - m) * r;
          ab[c] += dy[c];
        }
      }
      for (int64_t c = 0; c < w; ++c) {
        dweight[c0 + c] += aw[c];
        dbias[c0 + c] += ab[c];
      }
    }
  }
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*, const float*, int64_t,
                                       int64_t, double);
template void layernorm_forward<double>(double*, double*, double*, const double*, const double*, const double*,
                                        int64_t, int64_t, double);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, int64_t, int64_t);
template void layernorm_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                         const double*, const double*, int64_t, int64_t);

}  // namespace mt::kernels::cpu
