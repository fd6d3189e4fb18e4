// Helpers shared by the CPU kernels: static OpenMP partitioning of an index range, and Eigen maps over raw
// row-major buffers (Eigen's vectorised exp/tanh/sqrt and its GEMM are used inside the kernels).
#pragma once
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>

namespace mt::kernels::cpu {

template <typename T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using MatMap = Eigen::Map<RowMat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using CMatMap = Eigen::Map<const RowMat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using ArrMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <typename T>
using CArrMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// A [rows, cols] row-major view with leading dimension ld (>= cols).
template <typename T>
MatMap<T> mat(T* p, int64_t rows, int64_t cols, int64_t ld) {
  return MatMap<T>(p, rows, cols, Eigen::OuterStride<>(ld));
}
template <typename T>
CMatMap<T> cmat(const T* p, int64_t rows, int64_t cols, int64_t ld) {
  return CMatMap<T>(p, rows, cols, Eigen::OuterStride<>(ld));
}

// Below this many elements an elementwise kernel runs on one thread: waking the team costs more than it saves.
constexpr int64_t kParallelGrain = 1 << 14;

// Calls f(begin, end) on contiguous, static, 64-element-aligned chunks of [0, n), one per OpenMP thread.
template <typename F>
void parallel_ranges(int64_t n, F&& f) {
  if (n <= kParallelGrain || omp_get_max_threads() == 1 || omp_in_parallel()) {
    if (n > 0) f(int64_t(0), n);
    return;
  }
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t per = ((n + nt - 1) / nt + 63) / 64 * 64;
    const int64_t b = std::min(n, t * per), e = std::min(n, b + per);
    if (b < e) f(b, e);
  }
}

}  // namespace mt::kernels::cpu
