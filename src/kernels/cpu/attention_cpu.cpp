// CPU causal attention: one OpenMP task per (batch, head) pair; inside it the products are Eigen GEMMs on
// strided views of qkv (single-threaded there: Eigen does not nest inside an OpenMP parallel region), and the
// softmax uses Eigen's vectorised exp. Causality: scores above the diagonal are never used, probabilities there
// are stored as 0, and so the backward products see zeros there too.
// Every product runs per block of kBlock query rows (or key rows) over only the part of the other operand that
// block can see, so most of the work above the diagonal is skipped; plain GEMMs on those blocks replaced Eigen's
// triangularView products (attention 8-16% faster at configs A and B, bench/bench_ops).
// 16-bit storage (bf16, fp16): each task widens its head's q, k, v (and dout, att) into fp32 scratch and runs the
// same fp32 code on it; the probabilities are rounded once into att and out is computed from those rounded values
// (as a fused GPU kernel rounds P before P V); every output element is rounded once. fp32 and fp64 work in place
// on the tensors, exactly as before 16-bit storage existed.
#include "kernels/cpu/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

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

// In place over the scores a [T, T] (ld T, j <= i valid): the probabilities softmax(scale * s) per row, 0 above
// the diagonal.
template <typename T>
void causal_softmax(T* a, int64_t T_, T scale) {
  for (int64_t i = 0; i < T_; ++i) {
    auto row = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(a + i * T_, i + 1);
    const T mx = row.maxCoeff();
    row = ((row - mx) * scale).exp();  // softmax(scale * s): the max of scale*s is scale*max(s), scale > 0
    row *= T(1) / row.sum();
    std::fill(a + i * T_ + i + 1, a + (i + 1) * T_, T(0));
  }
}

// In place over d = dP [T, T] (j <= i valid): dS = P * (dP - sum_j P dP), times the score scale; 0 above the
// diagonal.
template <typename T>
void causal_softmax_backward(T* d, const T* p, int64_t T_, T scale) {
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
}

// Rounds n up to whole 64-byte lines of floats.
constexpr int64_t lines(int64_t n) { return (n + 15) / 16 * 16; }

// dst [T, HS] (ld HS) = src [T, HS] (ld lds), widened.
template <typename S>
void widen(float* dst, const S* src, int64_t lds, int64_t T_, int64_t HS) {
  for (int64_t t = 0; t < T_; ++t)
    for (int64_t k = 0; k < HS; ++k) dst[t * HS + k] = load(src[t * lds + k]);
}

// dst [T, HS] (ld ldd) = src [T, HS] (ld HS), each element rounded once.
template <typename S>
void narrow(S* dst, int64_t ldd, const float* src, int64_t T_, int64_t HS) {
  for (int64_t t = 0; t < T_; ++t)
    for (int64_t k = 0; k < HS; ++k) store(dst[t * ldd + k], src[t * HS + k]);
}
}  // namespace

template <typename S>
void attention_forward(S* out, S* att, const S* qkv, int64_t B, int64_t T_, int64_t C, int64_t NH) {
  using A = acc_t<S>;
  const int64_t HS = C / NH, C3 = 3 * C;
  const A scale = A(1) / std::sqrt(A(HS));
#pragma omp parallel for schedule(static) if (B * NH > 1 && B * T_ * C > kParallelGrain)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const S* q = qkv + b * T_ * C3 + h * HS;
    S* a = att + bh * T_ * T_;
    S* o = out + b * T_ * C + h * HS;
    if constexpr (!is_16bit<S>) {
      causal_abt(a, q, C3, q + C, C3, T_, HS);
      causal_softmax(a, T_, scale);
      lower_times(o, C, static_cast<const S*>(a), q + 2 * C, C3, T_, HS);
    } else {
      const int64_t th = lines(T_ * HS);
      float* qf = thread_scratch(3 * th + T_ * T_);
      float *kf = qf + th, *vf = kf + th, *p = vf + th;
      widen(qf, q, C3, T_, HS), widen(kf, q + C, C3, T_, HS), widen(vf, q + 2 * C, C3, T_, HS);
      causal_abt(p, static_cast<const float*>(qf), HS, static_cast<const float*>(kf), HS, T_, HS);
      causal_softmax(p, T_, scale);
      // Round each probability once into att; P V then uses exactly the stored values (zeros above the diagonal).
      for (int64_t i = 0; i < T_ * T_; ++i) store(a[i], p[i]), p[i] = load(a[i]);
      float* of = qf;  // q is dead once the scores exist
      lower_times(of, HS, static_cast<const float*>(p), static_cast<const float*>(vf), HS, T_, HS);
      narrow(o, C, of, T_, HS);
    }
  }
}

template <typename S>
void attention_backward(S* dqkv, acc_t<S>* datt, const S* dout, const S* qkv, const S* att, int64_t B, int64_t T_,
                        int64_t C, int64_t NH) {
  using A = acc_t<S>;
  const int64_t HS = C / NH, C3 = 3 * C;
  const A scale = A(1) / std::sqrt(A(HS));
#pragma omp parallel for schedule(static) if (B * NH > 1 && B * T_ * C > kParallelGrain)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const S* q = qkv + b * T_ * C3 + h * HS;
    S* dq = dqkv + b * T_ * C3 + h * HS;
    const S* dO = dout + b * T_ * C + h * HS;
    const S* p = att + bh * T_ * T_;
    A* d = datt + bh * T_ * T_;
    if constexpr (!is_16bit<S>) {
      // dV = P^T dO; dP = dO V^T (only j <= i is needed: P is 0 above the diagonal, so dS is too).
      lower_t_times(dq + 2 * C, C3, p, dO, C, T_, HS);
      causal_abt(d, dO, C, q + 2 * C, C3, T_, HS);
      causal_softmax_backward(d, p, T_, scale);
      // dQ = dS K, dK = dS^T Q.
      lower_times(dq, C3, static_cast<const A*>(d), q + C, C3, T_, HS);
      lower_t_times(dq + C, C3, static_cast<const A*>(d), q, C3, T_, HS);
    } else {
      // The same products in fp32 on widened copies; dP and dS live in datt (fp32), each of dq, dk, dv is rounded
      // once into dqkv.
      const int64_t th = lines(T_ * HS);
      float* qf = thread_scratch(5 * th + T_ * T_);
      float *kf = qf + th, *vf = kf + th, *gf = vf + th, *rf = gf + th, *pf = rf + th;
      widen(qf, q, C3, T_, HS), widen(kf, q + C, C3, T_, HS), widen(vf, q + 2 * C, C3, T_, HS);
      widen(gf, dO, C, T_, HS);
      for (int64_t i = 0; i < T_ * T_; ++i) pf[i] = load(p[i]);
      const float *cq = qf, *ck = kf, *cv = vf, *cg = gf, *cp = pf, *cd = d;
      lower_t_times(rf, HS, cp, cg, HS, T_, HS);
      narrow(dq + 2 * C, C3, rf, T_, HS);
      causal_abt(d, cg, HS, cv, HS, T_, HS);
      causal_softmax_backward(d, cp, T_, scale);
      lower_times(rf, HS, cd, ck, HS, T_, HS);
      narrow(dq, C3, rf, T_, HS);
      lower_t_times(rf, HS, cd, cq, HS, T_, HS);
      narrow(dq + C, C3, rf, T_, HS);
    }
  }
}

#define MT_ATTENTION_INSTANTIATE(S)                                                                             \
  template void attention_forward<S>(S*, S*, const S*, int64_t, int64_t, int64_t, int64_t);                    \
  template void attention_backward<S>(S*, acc_t<S>*, const S*, const S*, const S*, int64_t, int64_t, int64_t, \
                                      int64_t);
MT_ATTENTION_INSTANTIATE(float)
MT_ATTENTION_INSTANTIATE(double)
MT_ATTENTION_INSTANTIATE(bf16)
MT_ATTENTION_INSTANTIATE(fp16)
#undef MT_ATTENTION_INSTANTIATE

}  // namespace mt::kernels::cpu
