// CPU matmul: Eigen's GEMM (parallelised over the same OpenMP threads as every other kernel), chosen over
// OpenBLAS by bench/bench_matmul (see docs/performance.md, "Matmul backend"). Bias broadcast and the bias
// gradient are OpenMP loops. The 16-bit kernels widen their operands into fp32 scratch and run the fp32 kernel
// (fp32 accumulation, as cuBLASLt's), rounding each output element once; fp32 and fp64 run in place.
#include "kernels/cpu/matmul_cpu.h"

#include <cstring>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {
namespace {
template <typename S>
void widen(float* dst, const S* src, int64_t n) {
  parallel_ranges(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dst[i] = load(src[i]);
  });
}

template <typename S>
void round_into(S* dst, const float* src, int64_t n) {
  parallel_ranges(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) store(dst[i], src[i]);
  });
}

// The fp32/fp64 kernels, on the tensors themselves.
template <typename T>
void forward_in_place(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC,
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
void backward_in_place(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int64_t N,
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
}  // namespace

template <typename S>
void matmul_forward(S* out, const S* inp, const S* weight, const S* bias, int64_t N, int64_t C, int64_t OC,
                    WeightLayout layout) {
  if constexpr (!is_16bit<S>) {
    forward_in_place(out, inp, weight, bias, N, C, OC, layout);
  } else {
    float* in32 = thread_scratch(int64_t(N * C + C * OC + OC + N * OC));
    float *w32 = in32 + N * C, *b32 = w32 + C * OC, *out32 = b32 + OC;
    widen(in32, inp, N * C), widen(w32, weight, C * OC);
    if (bias) widen(b32, bias, OC);
    forward_in_place(out32, in32, w32, bias ? b32 : nullptr, N, C, OC, layout);
    round_into(out, out32, N * OC);
  }
}

template <typename S>
void matmul_backward(S* dinp, acc_t<S>* dweight, acc_t<S>* dbias, const S* dout, const S* inp, const S* weight,
                     int64_t N, int64_t C, int64_t OC, WeightLayout layout) {
  if constexpr (!is_16bit<S>) {
    backward_in_place(dinp, dweight, dbias, dout, inp, weight, N, C, OC, layout);
  } else {
    // Only the operands a requested gradient reads are widened (null maps are never read). dweight and dbias
    // are fp32 and accumulate in place.
    float* dout32 = thread_scratch(int64_t(N * OC + 2 * N * C + C * OC));
    float *in32 = dout32 + N * OC, *w32 = in32 + N * C, *dinp32 = w32 + C * OC;
    widen(dout32, dout, N * OC);
    if (dweight) widen(in32, inp, N * C);
    if (dinp) widen(w32, weight, C * OC);
    backward_in_place(dinp ? dinp32 : nullptr, dweight, dbias, dout32, dweight ? in32 : nullptr,
                      dinp ? w32 : nullptr, N, C, OC, layout);
    if (dinp) round_into(dinp, dinp32, N * C);
  }
}

#define MT_MATMUL_INSTANTIATE(S)                                                                                \
  template void matmul_forward<S>(S*, const S*, const S*, const S*, int64_t, int64_t, int64_t, WeightLayout); \
  template void matmul_backward<S>(S*, acc_t<S>*, acc_t<S>*, const S*, const S*, const S*, int64_t, int64_t,   \
                                   int64_t, WeightLayout);
MT_MATMUL_INSTANTIATE(float)
MT_MATMUL_INSTANTIATE(double)
MT_MATMUL_INSTANTIATE(bf16)
MT_MATMUL_INSTANTIATE(fp16)
#undef MT_MATMUL_INSTANTIATE

}  // namespace mt::kernels::cpu
