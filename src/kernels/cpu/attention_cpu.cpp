// CPU causal attention: one OpenMP task per (batch, head) pair; inside it the products are Eigen GEMMs on
// strided views of qkv (single-threaded there: Eigen does not nest inside an OpenMP parallel region), and the
// softmax uses Eigen's vectorised exp. Causality: scores above the diagonal are never used, probabilities there
// are stored as 0, and so the backward products see zeros there too.
// Every product runs per block of kBlock query rows (or key rows) over only the part of the other operand that
// block can see, so most of the work above the diagonal is skipped; plain GEMMs on those blocks replaced Eigen's
// triangularView products (attention 8-16% faster at configs A and B, bench/bench_ops).
#include "kernels/cpu/attention_cpu.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {
namespace {
// Rows per block: smaller skips more of the upper triangle but makes each GEMM less efficient (16, 32 and 64
// measured the same within noise at T 64 and 128).
constexpr int64_t kBlock = 32;

// Lower-triangular D = A B^T: D [T, T] (ld T), A and B [T, HS] (ld lda, ldb). Query block [i0, i1) gets
// columns [0, i1); entries right of that are left unwritten (callers only read j <= i).
template <typename T>
void causal_abt(T* d, const T* a, int64_t lda, const T* b, int64_t ldb, int64_t T_, int64_t HS) {
  for (int64_t i0 = 0; i0 < T_; i0 += kBlock) {
    const int64_t i1 = std::min(T_, i0 + kBlock);
    mat(d + i0 * T_, i1 - i0, i1, T_).noalias() =
        cmat(a + i0 * lda, i1 - i0, HS, lda) * cmat(b, i1, HS, ldb).transpose();
  }
}

// Y = L X with L [T, T] (ld T) lower triangular, stored zeros above the diagonal; X, Y [T, HS].
template <typename T>
void lower_times(T* y, int64_t ldy, const T* l, const T* x, int64_t ldx, int64_t T_, int64_t HS) {
  for (int64_t i0 = 0; i0 < T_; i0 += kBlock) {
    const int64_t i1 = std::min(T_, i0 + kBlock);
    mat(y + i0 * ldy, i1 - i0, HS, ldy).noalias() = cmat(l + i0 * T_, i1 - i0, i1, T_) * cmat(x, i1, HS, ldx);
  }
}

// Y = L^T X with L as above: key block [j0, j1) gets rows [j0, T) of L.
template <typename T>
void lower_t_times(T* y, int64_t ldy, const T* l, const T* x, int64_t ldx, int64_t T_, int64_t HS) {
  for (int64_t j0 = 0; j0 < T_; j0 += kBlock) {
    const int64_t j1 = std::min(T_, j0 + kBlock);
    mat(y + j0 * ldy, j1 - j0, HS, ldy).noalias() =
        cmat(l + j0 * T_ + j0, T_ - j0, j1 - j0, T_).transpose() * cmat(x + j0 * ldx, T_ - j0, HS, ldx);
  }
}
}  // namespace

template <typename T>
void attention_forward(T* out, T* att, const T* qkv, int64_t B, int64_t T_, int64_t C, int64_t NH) {
  const int64_t HS = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(HS));
#pragma omp parallel for schedule(static) if (B * NH > 1 && B * T_ * C > kParallelGrain)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const T* q = qkv + b * T_ * C3 + h * HS;
    T* a = att + bh * T_ * T_;
    causal_abt(a, q, C3, q + C, C3, T_, HS);
    for (int64_t i = 0; i < T_; ++i) {
      auto row = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(a + i * T_, i + 1);
      const T mx = row.maxCoeff();
      row = ((row - mx) * scale).exp();  // softmax(scale * s): the max of scale*s is scale*max(s), scale > 0
      row *= T(1) / row.sum();
      std::fill(a + i * T_ + i + 1, a + (i + 1) * T_, T(0));
    }
    lower_times(out + b * T_ * C + h * HS, C, static_cast<const T*>(a), q + 2 * C, C3, T_, HS);
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
    const T* dO = dout + b * T_ * C + h * HS;
    const T* p = att + bh * T_ * T_;
    T* d = datt + bh * T_ * T_;
    // dV = P^T dO; dP = dO V^T (only j <= i is needed: P is 0 above the diagonal, so dS is too).
    lower_t_times(dq + 2 * C, C3, p, dO, C, T_, HS);
    causal_abt(d, dO, C, q + 2 * C, C3, T_, HS);
    // dS = P * (dP - sum_j P dP), times the score scale; zero above the diagonal.
    for (int64_t i = 0; i < T_; ++i) {
      const T* pi = p + i * T_;
      T* r = d + i * T_;
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j <= i; ++j) dot += pi[j] * r[j];
#pragma omp simd
      for (int64_t j = 0; j <= i; ++j) r[j] = pi[j] * (r[j] - dot) * scale;
      std::fill(r + i + 1, r + T_, T(0));
    }
    // dQ = dS K, dK = dS^T Q.
    lower_times(dq, C3, static_cast<const T*>(d), q + C, C3, T_, HS);
    lower_t_times(dq + C, C3, static_cast<const T*>(d), q, C3, T_, HS);
  }
}

template void attention_forward<float>(float*, float*, const float*, int64_t, int64_t, int64_t, int64_t);
template void attention_forward<double>(double*, double*, const double*, int64_t, int64_t, int64_t, int64_t);
template void attention_backward<float>(float*, float*, const float*, const float*, const float*, int64_t, int64_t,
                                        int64_t, int64_t);
template void attention_backward<double>(double*, double*, const double*, const double*, const double*, int64_t,
                                         int64_t, int64_t, int64_t);

}  // namespace mt::kernels::cpu
