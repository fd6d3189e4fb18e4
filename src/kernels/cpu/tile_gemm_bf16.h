// Register-tiled bf16 products on the CPU's bf16 dot product (AVX512-BF16's vdpbf16ps: per fp32 lane, the sum of
// two bf16 products added to an fp32 accumulator), for bf16 attention: tile_gemm.h's tiles with half the inner
// iterations, each instruction doing the work of two fp32 FMAs. Operands come in pairs along the sum's index k:
//  - the left-hand operand's pair (A(r, 2kk), A(r, 2kk + 1)): two adjacent bf16 values, broadcast to every lane;
//  - the right-hand operand is stored as pair rows: row kk holds (B(2kk, j), B(2kk + 1, j)) for each column j,
//    one 32-bit word per column, whole vectors of kLanes columns (pack_pair_rows and pack_pair_columns make them).
// Where the CPU has no AVX512-BF16 at build time, kPairTiles is false and callers keep the fp32 tiles.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kernels/cpu/storage.h"
#include "kernels/cpu/tile_gemm.h"

namespace mt::kernels::cpu::pair_tile {

#if defined(__AVX512BF16__) && defined(__AVX512F__)
constexpr bool kPairTiles = true;
#else
constexpr bool kPairTiles = false;
#endif
using tile::kLanes;

// The left-hand operand: the pair (r, kk) is the two bf16 values from p + r * row + kk * col (read as one 32-bit
// word through memcpy: the values were stored as bf16).
struct Pairs {
  const bf16* p;
  int64_t row, col;
};

// The right-hand operand: pair rows of whole vectors of words, pair row kk at p + kk * ld.
struct PairRows {
  const uint32_t* p;
  int64_t ld;
};

// A pair of bf16 values (lo: the even k, hi: the odd k) as one word.
inline uint32_t pair(bf16 lo, bf16 hi) { return uint32_t(lo.bits) | uint32_t(hi.bits) << 16; }

// dst pair row kk, column j = (src[2kk, j], src[2kk + 1, j]) for src [rows, cols] (ld lds, bf16): pair rows of
// ldd words, zero in the columns [cols, ldd) and where 2kk + 1 = rows (an odd count's missing row).
inline void pack_pair_rows(uint32_t* dst, int64_t ldd, const bf16* src, int64_t lds, int64_t rows, int64_t cols) {
  for (int64_t kk = 0; kk < (rows + 1) / 2; ++kk) {
    const bf16* a = src + 2 * kk * lds;
    const bf16* b = 2 * kk + 1 < rows ? a + lds : nullptr;
    uint32_t* d = dst + kk * ldd;
    for (int64_t j = 0; j < cols; ++j) d[j] = pair(a[j], b ? b[j] : bf16{0});
    std::fill(d + cols, d + ldd, 0u);
  }
}

// The transpose's pair rows: dst pair row kk, column j = (src[j, 2kk], src[j, 2kk + 1]) for src [rows, cols] (ld
// lds, bf16, cols even): a transpose of 32-bit words, zero in the columns [rows, ldd). Read row by row: a column
// of qkv's rows, 3 C values apart (a multiple of 512 bytes), falls into a few sets of the L1 cache.
inline void pack_pair_columns(uint32_t* dst, int64_t ldd, const bf16* src, int64_t lds, int64_t rows,
                              int64_t cols) {
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t kk = 0; kk < cols / 2; ++kk) std::memcpy(dst + kk * ldd + j, src + j * lds + 2 * kk, 4);
  for (int64_t kk = 0; kk < cols / 2; ++kk) std::fill(dst + kk * ldd + rows, dst + (kk + 1) * ldd, 0u);
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
// The bf16 tile, the kernel of tile_gemm.h's drivers (tile::rows_times<PairTile>, the k range in pairs):
// C[r, 0 : NV * kLanes] = sum over pairs kk in [kk0, kk1) of A(r, 2kk) B(2kk, :) + A(r, 2kk + 1) B(2kk + 1, :),
// for r < MR; C fp32 row-major (ldc floats). Overwrites C.
struct PairTile {
  template <int MR, int NV>
  static void run(float* c, int64_t ldc, Pairs a, PairRows b, int64_t kk0, int64_t kk1) {
    __m512 acc[MR][NV];
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
    for (int64_t kk = kk0; kk < kk1; ++kk) {
      __m512bh bv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b.p + kk * b.ld + v * kLanes);
      const bf16* ak = a.p + kk * a.col;
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        int32_t w;
        std::memcpy(&w, ak + r * a.row, 4);
        const __m512bh ar = (__m512bh)_mm512_set1_epi32(w);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], ar, bv[v]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + v * kLanes, acc[r][v]);
  }
};
#endif

}  // namespace mt::kernels::cpu::pair_tile
