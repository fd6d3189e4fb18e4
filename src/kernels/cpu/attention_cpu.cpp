// CPU causal attention: one OpenMP task per (batch, head) pair; inside it the products are Eigen GEMMs on
// strided views of qkv (single-threaded there: Eigen does not nest inside an OpenMP parallel region), and the
// softmax uses Eigen's vectorised exp. Causality: scores above the diagonal are never used, probabilities there
// are stored as 0, and so the backward products see zeros there too.
#include "kernels/cpu/attention_cpu.h"

#include <cmath>

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {

template <typename T>
void attention_forward(T* out, T* att, const T* qkv, int64_t B, int64_t T_, int64_t C, int64_t NH) {
  const int64_t HS = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(HS));
#pragma omp parallel for schedule(static) if (B * NH > 1 && B * T_ * C > kParallelGrain)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const T* q = qkv + b * T_ * C3 + h * HS;
    auto Q = cmat(q, T_, HS, C3), K = cmat(q + C, T_, HS, C3), V = cmat(q + 2 * C, T_, HS, C3);
    T* a = att + bh * T_ * T_;
    auto P = mat(a, T_, T_, T_);
    P.noalias() = Q * K.transpose();
    for (int64_t i = 0; i < T_; ++i) {
      auto row = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(a + i * T_, i + 1);
      const T mx = row.maxCoeff();
      row = ((row - mx) * scale).exp();  // softmax(scale * s): the max of scale*s is scale*max(s), scale > 0
      row *= T(1) / row.sum();
      std::fill(a + i * T_ + i + 1, a + (i + 1) * T_, T(0));
    }
    mat(out + b * T_ * C + h * HS, T_, HS, C).noalias() = P.template triangularView<Eigen::Lower>() * V;
  }
}

template <typename T>
void attention_backward(T* dqkv, T* datt, const T* dout, const T* qkv, const T* att, int64_t B, int64_t T_,
                        int64_t C, int64_t NH) {
  const int64_t HS = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(HS));
#pragma omp parallel for schedule(static) if (B * NH > 1 && B * T_ * C > kParallelGrain)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const T* q = qkv + b * T_ * C3 + h * HS;
    T* dq = dqkv + b * T_ * C3 + h * HS;
    auto Q = cmat(q, T_, HS, C3), K = cmat(q + C, T_, HS, C3), V = cmat(q + 2 * C, T_, HS, C3);
    auto DO = cmat(dout + b * T_ * C + h * HS, T_, HS, C);
    auto P = cmat(att + bh * T_ * T_, T_, T_, T_);
    T* d = datt + bh * T_ * T_;
    auto DP = mat(d, T_, T_, T_);
    // dV = P^T dO; dP = dO V^T (only j <= i is needed: P is 0 above the diagonal, so dS is too).
    mat(dq + 2 * C, T_, HS, C3).noalias() = P.transpose().template triangularView<Eigen::Upper>() * DO;
    DP.noalias() = DO * V.transpose();
    // dS = P * (dP - sum_j P dP), times the score scale; zero above the diagonal.
    for (int64_t i = 0; i < T_; ++i) {
      const T* p = att + bh * T_ * T_ + i * T_;
      T* r = d + i * T_;
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j <= i; ++j) dot += p[j] * r[j];
#pragma omp simd
      for (int64_t j = 0; j <= i; ++j) r[j] = p[j] * (r[j] - dot) * scale;
      std::fill(r + i + 1, r + T_, T(0));
    }
    auto DS = cmat(static_cast<const T*>(d), T_, T_, T_);
    mat(dq, T_, HS, C3).noalias() = DS.template triangularView<Eigen::Lower>() * K;
    mat(dq + C, T_, HS, C3).noalias() = DS.transpose().template triangularView<Eigen::Upper>() * Q;
  }
}

template void attention_forward<float>(float*, float*, const float*, int64_t, int64_t, int64_t, int64_t);
template void attention_forward<double>(double*, double*, const double*, int64_t, int64_t, int64_t, int64_t);
template void attention_backward<float>(float*, float*, const float*, const float*, const float*, int64_t, int64_t,
                                        int64_t, int64_t);
template void attention_backward<double>(double*, double*, const double*, const double*, const double*, int64_t,
                                         int64_t, int64_t, int64_t);

}  // namespace mt::kernels::cpu
