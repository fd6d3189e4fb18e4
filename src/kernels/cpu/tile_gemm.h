// Register-tiled fp32 products for the small matrices of attention (one head: T x T scores against T x HS
// operands), where a general GEMM's packing and dispatch cost more than the arithmetic. Each tile of MR rows and
// NV vectors of columns keeps its sums in registers for the whole inner loop; the right-hand operand's rows are
// read as vectors (so it must be padded to whole vectors) and the left-hand operand's elements are broadcast, read
// through two strides so that a transposed operand needs no copy. Sizes are compile-time so the compiler keeps
// the MR x NV accumulators in registers (a version with run-time tile sizes spilled them and ran at 0.64x Eigen).
#pragma once
#include <cstdint>
#include <cstring>

namespace mt::kernels::cpu::tile {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr int kRows = 8;  // 8 x 2 accumulators + 2 operand vectors + 1 broadcast of the 32 zmm registers
#else
constexpr int kLanes = 8;
constexpr int kRows = 6;  // 6 x 2 + 3 of the 16 ymm registers: 12 sums in flight (with 4 rows, 8, attention ran
                          // 1.2-1.4x longer on an AMD EPYC with Zen 3; docs/performance.md)
#endif
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

inline Vec load_vec(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_vec(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }
// x in every lane (x - 0 is x for every x, -0 included, so this is one broadcast; x + 0 would not be).
inline Vec splat(float x) { return x - Vec{}; }

// n rounded up to whole vectors.
constexpr int64_t padded(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// The left-hand operand: element (r, k) at p[r * row + k * col].
struct Strided {
  const float* p;
  int64_t row, col;
};

// The right-hand operand: rows of whole vectors, row k at p + k * ld.
struct Rows {
  const float* p;
  int64_t ld;
};

// The fp32 tile, the drivers' kernel (tile_gemm_bf16.h has the bf16 one):
// C[r, 0 : NV * kLanes] = sum over k in [k0, k1) of A(r, k) B[k, 0 : NV * kLanes], for r < MR; C row-major
// with leading dimension ldc. Overwrites C (zeros where the k range is empty).
struct Fp32Tile {
  template <int MR, int NV>
  static void run(float* c, int64_t ldc, Strided a, Rows b, int64_t k0, int64_t k1) {
    Vec acc[MR][NV];
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = Vec{};
    for (int64_t k = k0; k < k1; ++k) {
      Vec bv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) bv[v] = load_vec(b.p + k * b.ld + v * kLanes);
      const float* ak = a.p + k * a.col;
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const Vec ar = splat(ak[r * a.row]);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] += ar * bv[v];
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) store_vec(c + r * ldc + v * kLanes, acc[r][v]);
  }
};

// The drivers, for any kernel K whose left-hand operand A has (p, row, col) and right-hand operand B (p, ld) with
// rows of whole vectors. The columns [0, n) of MR rows (n a whole number of vectors), in tiles of two vectors and
// one.
template <class K, int MR, class A, class B>
inline void row_tiles(float* c, int64_t ldc, A a, B b, int64_t n, int64_t k0, int64_t k1) {
  int64_t j = 0;
  for (; j + 2 * kLanes <= n; j += 2 * kLanes) K::template run<MR, 2>(c + j, ldc, a, B{b.p + j, b.ld}, k0, k1);
  if (j < n) K::template run<MR, 1>(c + j, ldc, a, B{b.p + j, b.ld}, k0, k1);
}

// rows (< kRows) rows: the tile height chosen at run time among the compiled ones.
template <class K, int MR = kRows - 1, class A, class B>
inline void short_row_tiles(int rows, float* c, int64_t ldc, A a, B b, int64_t n, int64_t k0, int64_t k1) {
  if constexpr (MR > 0) {
    if (rows == MR) return row_tiles<K, MR>(c, ldc, a, b, n, k0, k1);
    short_row_tiles<K, MR - 1>(rows, c, ldc, a, b, n, k0, k1);
  }
}

// C[M, ...] = A B over row blocks of kRows: block [r0, r1) computes columns [0, cols(r0, r1)) (whole vectors) over
// k in [k_begin(r0), k_end(r1)) (the kernel's k: pairs of values for the bf16 tile). The callers' causal structure
// lives in those three functions.
template <class K = Fp32Tile, class A, class B, typename Cols, typename KBegin, typename KEnd>
inline void rows_times(float* c, int64_t ldc, A a, B b, int64_t M, Cols cols, KBegin k_begin, KEnd k_end) {
  for (int64_t r0 = 0; r0 < M; r0 += kRows) {
    const int64_t r1 = r0 + kRows < M ? r0 + kRows : M;
    const A ar{a.p + r0 * a.row, a.row, a.col};
    float* cr = c + r0 * ldc;
    if (r1 - r0 == kRows)
      row_tiles<K, kRows>(cr, ldc, ar, b, cols(r0, r1), k_begin(r0), k_end(r1));
    else
      short_row_tiles<K>(int(r1 - r0), cr, ldc, ar, b, cols(r0, r1), k_begin(r0), k_end(r1));
  }
}

}  // namespace mt::kernels::cpu::tile
