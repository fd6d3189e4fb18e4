// CPU matmul on Eigen's GEMM or oneDNN's (both on the same OpenMP threads as every other kernel); fp32 and bf16
// take the library of matmul_backends() (kernels/cpu/matmul_backend.h), fp64 always Eigen. On Eigen, bias
// broadcast and the bias gradient are OpenMP loops. A 16-bit matmul not on oneDNN's bf16 (fp16 always) widens its
// operands into fp32 scratch and runs fp32's matmul, on fp32's library (fp32 accumulation, as cuBLASLt's), rounding
// each output element once. oneDNN reads bf16 directly, accumulates in fp32, adds the bias and rounds each output
// element once.
#include "kernels/cpu/matmul_cpu.h"

#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/matmul_backend.h"
#include "kernels/cpu/onednn_gemm.h"
#include "kernels/cpu/parallel.h"

namespace mt::kernels::cpu {
namespace {
template <typename S>
void widen_in_parallel(float* dst, const S* src, int64_t n) {
  parallel_ranges(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dst[i] = load(src[i]);
  });
}

template <typename S>
void round_in_parallel(S* dst, const float* src, int64_t n) {
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

// dbias[OC] += sum over the N rows of dout. Each thread owns a block of columns and walks all rows: race-free,
// deterministic, and the inner loop is a unit-stride vector add.
template <typename S>
void bias_backward(acc_t<S>* dbias, const S* dout, int64_t N, int64_t OC) {
  constexpr int64_t kBlock = 64;
  const int64_t nblocks = (OC + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (N * OC > kParallelGrain)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t c0 = blk * kBlock, c1 = std::min(OC, c0 + kBlock);
    acc_t<S> acc[kBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const S* row = dout + n * OC + c0;
#pragma omp simd
      for (int64_t c = 0; c < c1 - c0; ++c) acc[c] += load(row[c]);
    }
    for (int64_t c = c0; c < c1; ++c) dbias[c] += acc[c - c0];
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
  if (dbias) bias_backward(dbias, dout, N, OC);
}

// oneDNN's type for S, which must be float or bf16.
template <typename S>
constexpr onednn::Type onednn_type() {
  return std::is_same_v<S, bf16> ? onednn::Type::BF16 : onednn::Type::F32;
}

// S is float or bf16 and its matmuls run on oneDNN.
template <typename S>
bool on_onednn() {
  if constexpr (std::is_same_v<S, float>) return matmul_backends().fp32 == MatmulLibrary::OneDNN;
  if constexpr (std::is_same_v<S, bf16>) return matmul_backends().bf16 == MatmulLibrary::OneDNN;
  return false;
}

template <typename S>
void forward_onednn(S* out, const S* inp, const S* weight, const S* bias, int64_t N, int64_t C, int64_t OC,
                    WeightLayout layout) {
  onednn::gemm(onednn::forward_shape(N, C, OC, layout == WeightLayout::OutIn, onednn_type<S>(), bias != nullptr), inp,
               weight, bias, out);
}

template <typename S>
void backward_onednn(S* dinp, float* dweight, float* dbias, const S* dout, const S* inp, const S* weight,
                     int64_t N, int64_t C, int64_t OC, WeightLayout layout) {
  const bool out_in = layout == WeightLayout::OutIn;
  if (dinp) onednn::gemm(onednn::dinp_shape(N, C, OC, out_in, onednn_type<S>()), dout, weight, nullptr, dinp);
  if (dweight) {  // accumulated in fp32: inp^T dout, or dout^T inp in the OutIn layout
    const void *a = inp, *b = dout;
    if (out_in) std::swap(a, b);
    onednn::gemm(onednn::dweight_shape(N, C, OC, out_in, onednn_type<S>()), a, b, nullptr, dweight);
  }
  if (dbias) bias_backward(dbias, dout, N, OC);
}
}  // namespace

template <typename S>
void matmul_forward(S* out, const S* inp, const S* weight, const S* bias, int64_t N, int64_t C, int64_t OC,
                    WeightLayout layout) {
  if (on_onednn<S>()) {
    if constexpr (std::is_same_v<S, float> || std::is_same_v<S, bf16>)
      forward_onednn(out, inp, weight, bias, N, C, OC, layout);
  } else if constexpr (!is_16bit<S>) {
    forward_in_place(out, inp, weight, bias, N, C, OC, layout);
  } else {
    float* in32 = thread_scratch(int64_t(N * C + C * OC + OC + N * OC));
    float *w32 = in32 + N * C, *b32 = w32 + C * OC, *out32 = b32 + OC;
    widen_in_parallel(in32, inp, N * C), widen_in_parallel(w32, weight, C * OC);
    if (bias) widen_in_parallel(b32, bias, OC);
    matmul_forward<float>(out32, in32, w32, bias ? b32 : nullptr, N, C, OC, layout);  // fp32's library
    round_in_parallel(out, out32, N * OC);
  }
}

template <typename S>
void matmul_backward(S* dinp, acc_t<S>* dweight, acc_t<S>* dbias, const S* dout, const S* inp, const S* weight,
                     int64_t N, int64_t C, int64_t OC, WeightLayout layout) {
  if (on_onednn<S>()) {
    if constexpr (std::is_same_v<S, float> || std::is_same_v<S, bf16>)
      backward_onednn(dinp, dweight, dbias, dout, inp, weight, N, C, OC, layout);
  } else if constexpr (!is_16bit<S>) {
    backward_in_place(dinp, dweight, dbias, dout, inp, weight, N, C, OC, layout);
  } else {
    // Only the operands a requested gradient reads are widened (null maps are never read). dweight and dbias
    // are fp32 and accumulate in place.
    float* dout32 = thread_scratch(int64_t(N * OC + 2 * N * C + C * OC));
    float *in32 = dout32 + N * OC, *w32 = in32 + N * C, *dinp32 = w32 + C * OC;
    widen_in_parallel(dout32, dout, N * OC);
    if (dweight) widen_in_parallel(in32, inp, N * C);
    if (dinp) widen_in_parallel(w32, weight, C * OC);
    matmul_backward<float>(dinp ? dinp32 : nullptr, dweight, dbias, dout32, dweight ? in32 : nullptr,
                           dinp ? w32 : nullptr, N, C, OC, layout);
    if (dinp) round_in_parallel(dinp, dinp32, N * C);
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
