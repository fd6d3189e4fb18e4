// CPU matmul: the products go to OpenBLAS (chosen over Eigen by bench/bench_matmul, see docs/performance.md);
// the bias broadcast and the bias gradient are OpenMP loops over columns.
#include "kernels/cpu/matmul_cpu.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>

namespace mt::kernels::cpu {
namespace {

inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}
inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, const double* a,
                 int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC,
                    WeightLayout layout) {
  T beta = 0;
  if (bias) {
    // out = bias, then GEMM with beta = 1 adds the product: one pass over out instead of two.
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * OC, bias, sizeof(T) * OC);
    beta = 1;
  }
  if (layout == WeightLayout::InOut)
    gemm(CblasNoTrans, CblasNoTrans, N, OC, C, inp, C, weight, OC, beta, out, OC);
  else
    gemm(CblasNoTrans, CblasTrans, N, OC, C, inp, C, weight, C, beta, out, OC);
}

template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int64_t N,
                     int64_t C, int64_t OC, WeightLayout layout) {
  const bool inout = layout == WeightLayout::InOut;
  if (dinp) {  // dinp[N, C] = dout[N, OC] @ W^T  (overwritten)
    if (inout)
      gemm(CblasNoTrans, CblasTrans, N, C, OC, dout, OC, weight, OC, T(0), dinp, C);
    else
      gemm(CblasNoTrans, CblasNoTrans, N, C, OC, dout, OC, weight, C, T(0), dinp, C);
  }
  if (dweight) {  // accumulated: beta = 1
    if (inout)  // dW[C, OC] += inp^T @ dout
      gemm(CblasTrans, CblasNoTrans, C, OC, N, inp, C, dout, OC, T(1), dweight, OC);
    else  // dW[OC, C] += dout^T @ inp
      gemm(CblasTrans, CblasNoTrans, OC, C, N, dout, OC, inp, C, T(1), dweight, C);
  }
  if (dbias) {
    // Each thread owns a block of columns and walks all rows: race-free, deterministic, and the inner loop is
    // a unit-stride vector add.
    constexpr int64_t kBlock = 64;
    const int64_t nblocks = (OC + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const int64_t c0 = blk * kBlock, c1 = std::min(OC, c0 + kBlock);
      T acc[kBlock] = {};
      for (int64_t n = 0; n < N; ++n) {
        const T* row = dout + n * OC;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
      }
      for (int64_t c = c0; c < c1; ++c) dbias[c] += acc[c - c0];
    }
  }
}

template void matmul_forward<float>(float*, const float*, const float*, const float*, int64_t, int64_t, int64_t,
                                    WeightLayout);
template void matmul_forward<double>(double*, const double*, const double*, const double*, int64_t, int64_t,
                                     int64_t, WeightLayout);
template void matmul_backward<float>(float*, float*, float*, const float*, const float*, const float*, int64_t,
                                     int64_t, int64_t, WeightLayout);
template void matmul_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                      int64_t, int64_t, int64_t, WeightLayout);

}  // namespace mt::kernels::cpu
