// CPU matmul: Eigen's GEMM (parallelised over the same OpenMP threads as every other kernel), chosen over
// OpenBLAS by bench/bench_matmul (see docs/performance.md, "Matmul backend"). Bias broadcast and the bias
// gradient are OpenMP loops.
#include "kernels/cpu/matmul_cpu.h"

#include <cstring>

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC,
                    WeightLayout layout) {
  auto O = mat(out, N, OC, OC);
  auto A = cmat(inp, N, C, C);
  if (bias) {
    // out = bias, then the GEMM accumulates into it: one pass over out instead of two.
#pragma omp parallel for schedule(static) if (N * OC > kParallelGrain)
    for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * OC, bias, sizeof(T) * OC);
    if (layout == WeightLayout::InOut)
      O.noalias() += A * cmat(weight, C, OC, OC);
    else
      O.noalias() += A * cmat(weight, OC, C, C).transpose();
  } else {
    if (layout == WeightLayout::InOut)
      O.noalias() = A * cmat(weight, C, OC, OC);
    else
      O.noalias() = A * cmat(weight, OC, C, C).transpose();
  }
}

template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int64_t N,
                     int64_t C, int64_t OC, WeightLayout layout) {
  const bool inout = layout == WeightLayout::InOut;
  auto DO = cmat(dout, N, OC, OC);
  auto A = cmat(inp, N, C, C);
  if (dinp) {  // dinp[N, C] = dout[N, OC] @ W^T  (overwritten)
    if (inout)
      mat(dinp, N, C, C).noalias() = DO * cmat(weight, C, OC, OC).transpose();
    else
      mat(dinp, N, C, C).noalias() = DO * cmat(weight, OC, C, C);
  }
  if (dweight) {  // accumulated
    if (inout)  // dW[C, OC] += inp^T @ dout
      mat(dweight, C, OC, OC).noalias() += A.transpose() * DO;
    else  // dW[OC, C] += dout^T @ inp
      mat(dweight, OC, C, C).noalias() += DO.transpose() * A;
  }
  if (dbias) {
    // Each thread owns a block of columns and walks all rows: race-free, deterministic, and the inner loop is
    // a unit-stride vector add.
    constexpr int64_t kBlock = 64;
    const int64_t nblocks = (OC + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (N * OC > kParallelGrain)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const int64_t c0 = blk * kBlock, c1 = std::min(OC, c0 + kBlock);
      T acc[kBlock] = {};
      for (int64_t n = 0; n < N; ++n) {
        const T* row = dout + n * OC + c0;
#pragma omp simd
        for (int64_t c = 0; c < c1 - c0; ++c) acc[c] += row[c];
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
