// CPU causal attention: one OpenMP task per (batch, head) pair. Causality: scores above the diagonal are never
// used, probabilities there are stored as 0, and so the backward products see zeros there too.
// fp32 and the 16-bit formats run each head's six products on register tiles (kernels/cpu/tile_gemm.h) over
// fp32 copies of the operands padded to whole vectors (K and V also transposed where they are the right-hand
// operand), each row block of the product computing only the part of the other operand it can see. 16-bit
// storage (bf16, fp16) widens into those copies, rounds the probabilities once into att and computes out from the
// rounded values (as a fused GPU kernel rounds P before P V); every output element is rounded once. The tiles
// replaced per-block Eigen GEMMs, single-threaded inside the per-head tasks (bench/bench_ops, docs/performance.md).
// bf16 with an even head size, where the CPU has AVX512-BF16, runs the six products on bf16 pair tiles instead
// (tile_gemm_bf16.h), its operands kept in bf16 and dS rounded to bf16 as the GPU's tensor-core kernel rounds it:
// 1.2x the fp32 tiles' speed at config B, 1.45x the widened bf16 path's (docs/performance.md).
// fp64, the reference of the gradient checks, keeps those Eigen products: blocks of kBlock query (or key) rows
// against the part of the other operand the block can see.
#include "kernels/cpu/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/tile_gemm.h"
#include "kernels/cpu/tile_gemm_bf16.h"

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

// In place over d = dP [T, T] (ld ldd, j <= i valid): dS = P * (dP - sum_j P dP), times the score scale; 0 above
// the diagonal. P [T, T] (ld T).
template <typename T>
void causal_softmax_backward(T* d, int64_t ldd, const T* p, int64_t T_, T scale) {
  for (int64_t i = 0; i < T_; ++i) {
    const T* pi = p + i * T_;
    T* r = d + i * ldd;
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

// dst[r, c] (ld ldd) = src[r, c] (ld lds) widened, for r < rows and c < cols; zeros in the columns [cols, ldd).
template <typename S>
void pack_rows(float* dst, int64_t ldd, const S* src, int64_t lds, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[r * ldd + c] = load(src[r * lds + c]);
    std::fill(dst + r * ldd + cols, dst + (r + 1) * ldd, 0.0f);
  }
}

// dst[c, r] (ld ldd) = src[r, c] (ld lds) widened: the transpose, with zeros in the columns [rows, ldd). The rows
// are first copied side by side into tmp [rows, cols]: read in place, a column's strided reads of the rows of qkv
// (3 C floats apart: a multiple of 512 bytes at the model's widths) fell into a few sets of the L1 cache and missed
// it, and the transpose took a fifth of the forward pass.
template <typename S>
void pack_transposed(float* dst, int64_t ldd, const S* src, int64_t lds, int64_t rows, int64_t cols, float* tmp) {
  pack_rows(tmp, cols, src, lds, rows, cols);
  for (int64_t c = 0; c < cols; ++c) {
    float* d = dst + c * ldd;
    for (int64_t r = 0; r < rows; ++r) d[r] = tmp[r * cols + c];
    std::fill(d + rows, d + ldd, 0.0f);
  }
}

// dst[r, c] (ld ldd) = src[r, c] (ld lds) for c < cols, each element rounded once.
template <typename S>
void narrow(S* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) store(dst[r * ldd + c], src[r * lds + c]);
}

// A tile product's right-hand operand src [rows, cols] (ld lds), widened into scratch [rows, padded(cols)]. Always
// a copy, even of fp32 rows: read in place, rows of qkv 3 C floats apart fall into a few sets of the L1 cache.
template <typename S>
tile::Rows operand(const S* src, int64_t lds, int64_t rows, int64_t cols, float* scratch) {
  pack_rows(scratch, tile::padded(cols), src, lds, rows, cols);
  return {scratch, tile::padded(cols)};
}

// A tile product's result, bound for dst [rows, cols] (ld ldd): fp32 rows of whole vectors are written in place;
// anything else goes to scratch padded to whole vectors and is rounded into dst by done().
template <typename S>
struct Result {
  S* dst;
  int64_t ldd;
  float* y;
  int64_t ld;
  Result(S* dst_, int64_t ldd_, int64_t cols, float* scratch)
      : dst(dst_), ldd(ldd_), y(scratch), ld(tile::padded(cols)) {
    if constexpr (std::is_same_v<S, float>)
      if (cols % tile::kLanes == 0) y = dst, ld = ldd;
  }
  void done(int64_t rows, int64_t cols) {
    if (static_cast<void*>(y) != static_cast<void*>(dst)) narrow(dst, ldd, y, ld, rows, cols);
  }
};

// One row of scores in place: si [n] (n whole vectors, 64-byte aligned, -inf past the diagonal) becomes
// exp(scale (s - max s)); returns its sum. With AVX-512 the max and the sum are vector loops ending in one tree
// reduction each (Eigen's maxCoeff and sum on these short rows end in scalar code): the forward pass of config B's
// attention went from 0.42 to 0.40 ms in bf16, 0.49 to 0.46 in fp32. The exp is Eigen's, element for element.
float exp_row(float* si, int64_t n, float scale) {
#if defined(__AVX512F__)
  using Eigen::internal::pexp;
  __m512 m = _mm512_load_ps(si);
  for (int64_t j = tile::kLanes; j < n; j += tile::kLanes) m = _mm512_max_ps(m, _mm512_load_ps(si + j));
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(m)), sc = _mm512_set1_ps(scale);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += tile::kLanes) {
    const __m512 e = pexp(_mm512_mul_ps(_mm512_sub_ps(_mm512_load_ps(si + j), mx), sc));
    _mm512_store_ps(si + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
#else
  auto row = Eigen::Map<Eigen::ArrayXf, Eigen::AlignedMax>(si, n);
  const float mx = row.maxCoeff();
  row = ((row - mx) * scale).exp();  // softmax(scale * s): the max of scale*s is scale*max(s), scale > 0
  return row.sum();
#endif
}

// One head's forward in fp32 on the register tiles, for fp32 and the 16-bit formats: q, k, v rows of ld `ld`,
// att [T, T] (the probabilities, 0 above the diagonal), out rows of ld ldo.
template <typename S>
void head_forward(S* o, int64_t ldo, S* att, const S* q, const S* k, const S* v, int64_t ld, int64_t T_, int64_t HS,
                  float scale) {
  using tile::padded;
  const int64_t Tp = padded(T_), Hp = padded(HS);
  const int64_t n_kt = lines(HS * Tp), n_s = lines(T_ * Tp), n_v = lines(T_ * Hp);
  float* kt = thread_scratch(n_kt + n_s + 2 * n_v + (is_16bit<S> ? lines(T_ * HS) + T_ * T_ : 0));
  float *s = kt + n_kt, *v_scratch = s + n_s, *y = v_scratch + n_v;
  pack_transposed(kt, Tp, k, ld, T_, HS, y);
  const tile::Rows vr = operand(v, ld, T_, HS, v_scratch);
  tile::Strided qa{nullptr, ld, 1};
  float* pf = nullptr;  // 16-bit: the rounded probabilities, widened
  if constexpr (is_16bit<S>) {
    float* qf = y + n_v;
    pack_rows(qf, HS, q, ld, T_, HS);
    qa = {qf, HS, 1};
    pf = qf + lines(T_ * HS);
  } else {
    qa.p = q;
  }
  // Scores: the row block [r0, r1) needs the columns [0, r1) only.
  tile::rows_times(s, Tp, qa, tile::Rows{kt, Tp}, T_, [](int64_t, int64_t r1) { return padded(r1); },
                   [](int64_t) { return int64_t(0); }, [HS](int64_t) { return HS; });
  // Softmax over whole vectors of each row of scores, the entries right of the diagonal set to -inf (so exp gives
  // 0): with the row's own length, Eigen left up to 15 exps per row to scalar expf (5-6% of the samples).
  for (int64_t i = 0; i < T_; ++i) {
    const int64_t n = padded(i + 1);
    float* si = s + i * Tp;
    std::fill(si + i + 1, si + n, -std::numeric_limits<float>::infinity());
    const float inv = 1.0f / exp_row(si, n, scale);
    S* a = att + i * T_;
    for (int64_t j = 0; j <= i; ++j) store(a[j], si[j] * inv);
    std::fill(a + i + 1, a + T_, S{});
    if constexpr (is_16bit<S>) {  // P V then uses exactly the stored values (as a fused GPU kernel rounds P first)
      for (int64_t j = 0; j < T_; ++j) pf[i * T_ + j] = load(a[j]);
    }
  }
  const float* p = pf;
  if constexpr (!is_16bit<S>) p = att;
  // out = P V: the row block [r0, r1) sees the keys [0, r1).
  Result<S> out(o, ldo, HS, y);
  tile::rows_times(out.y, out.ld, tile::Strided{p, T_, 1}, vr, T_, [Hp](int64_t, int64_t) { return Hp; },
                   [](int64_t) { return int64_t(0); }, [](int64_t r1) { return r1; });
  out.done(T_, HS);
}

// One head's backward on the register tiles: dq, dk, dv rows of ld ldd, dout rows of ld ldo, q, k, v rows of ld
// `ld`, att as head_forward stored it.
template <typename S>
void head_backward(S* dq, S* dk, S* dv, int64_t ldd, const S* dout, int64_t ldo, const S* q, const S* k,
                   const S* v, int64_t ld, const S* att, int64_t T_, int64_t HS, float scale) {
  using tile::padded;
  const int64_t Tp = padded(T_), Hp = padded(HS);
  const int64_t n_t = lines(HS * Tp), n_s = lines(T_ * Tp), n_h = lines(T_ * Hp);
  float* vt = thread_scratch(n_t + n_s + 4 * n_h + (is_16bit<S> ? T_ * T_ : 0));
  float *dp = vt + n_t, *g_scratch = dp + n_s, *k_scratch = g_scratch + n_h, *q_scratch = k_scratch + n_h;
  float* y = q_scratch + n_h;
  pack_transposed(vt, Tp, v, ld, T_, HS, y);
  const tile::Rows gr = operand(dout, ldo, T_, HS, g_scratch), kr = operand(k, ld, T_, HS, k_scratch),
                   qr = operand(q, ld, T_, HS, q_scratch);
  const float* p = nullptr;
  if constexpr (is_16bit<S>) {
    float* pf = y + n_h;
    for (int64_t i = 0; i < T_ * T_; ++i) pf[i] = load(att[i]);
    p = pf;
  } else {
    p = att;
  }
  const auto all_cols = [Hp](int64_t, int64_t) { return Hp; };
  const auto from_zero = [](int64_t) { return int64_t(0); };
  const auto to_end = [T_](int64_t) { return T_; };
  // dV = P^T dO: key row j sees the queries [j, T) (P is 0 above the diagonal).
  Result<S> rv(dv, ldd, HS, y);
  tile::rows_times(rv.y, rv.ld, tile::Strided{p, 1, T_}, gr, T_, all_cols, [](int64_t r0) { return r0; }, to_end);
  rv.done(T_, HS);
  // dP = dO V^T, the columns [0, r1) of the row block [r0, r1).
  tile::rows_times(dp, Tp, tile::Strided{gr.p, gr.ld, 1}, tile::Rows{vt, Tp}, T_,
                   [](int64_t, int64_t r1) { return padded(r1); }, from_zero, [HS](int64_t) { return HS; });
  // dS, in place of dP (in this thread's cache; datt, the caller's scratch of every head, would send it to memory
  // and back).
  causal_softmax_backward(dp, Tp, p, T_, scale);
  // dQ = dS K (query row i sees the keys [0, i]); dK = dS^T Q (key row j sees the queries [j, T)).
  Result<S> rq(dq, ldd, HS, y);
  tile::rows_times(rq.y, rq.ld, tile::Strided{dp, Tp, 1}, kr, T_, all_cols, from_zero, [](int64_t r1) { return r1; });
  rq.done(T_, HS);
  Result<S> rk(dk, ldd, HS, y);
  tile::rows_times(rk.y, rk.ld, tile::Strided{dp, 1, Tp}, qr, T_, all_cols, [](int64_t r0) { return r0; }, to_end);
  rk.done(T_, HS);
}
#if defined(__AVX512BF16__) && defined(__AVX512F__)
// bf16 on the pair tiles (tile_gemm_bf16.h; head size even): the six products take their operands in bf16, as the
// GPU's tensor cores do, and accumulate in fp32. Rounded where the GPU kernels round: the probabilities P (stored
// in att, and P V computed from them) and dS (before dQ = dS K and dK = dS^T Q); every output once.
using pair_tile::PairRows;
using pair_tile::Pairs;
using pair_tile::PairTile;

// A buffer of pair words as the bf16 values they hold.
const bf16* values(const uint32_t* words) { return reinterpret_cast<const bf16*>(words); }

void head_forward_pairs(bf16* o, int64_t ldo, bf16* att, const bf16* q, const bf16* k, const bf16* v, int64_t ld,
                        int64_t T_, int64_t HS, float scale) {
  using tile::padded;
  const int64_t Tp = padded(T_), Hp = padded(HS), Th = (T_ + 1) / 2, Hh = HS / 2;
  const int64_t n_kt = lines(Hh * Tp), n_v = lines(Th * Hp), n_p = lines(T_ * Tp / 2), n_s = lines(T_ * Tp);
  float* base = thread_scratch(n_kt + n_v + n_p + n_s + lines(T_ * Hp));
  uint32_t *kt = reinterpret_cast<uint32_t*>(base), *vp = kt + n_kt, *pp = vp + n_v;
  float *s = base + n_kt + n_v + n_p, *y = s + n_s;
  pair_tile::pack_pair_columns(kt, Tp, k, ld, T_, HS);  // K^T
  pair_tile::pack_pair_rows(vp, Hp, v, ld, T_, HS);
  // Scores: the row block [r0, r1) needs the columns [0, r1) only.
  tile::rows_times<PairTile>(
      s, Tp, Pairs{q, ld, 2}, PairRows{kt, Tp}, T_, [](int64_t, int64_t r1) { return padded(r1); },
      [](int64_t) { return int64_t(0); }, [Hh](int64_t) { return Hh; });
  for (int64_t i = 0; i < T_; ++i) {  // as head_forward's softmax
    const int64_t n = padded(i + 1);
    float* si = s + i * Tp;
    std::fill(si + i + 1, si + n, -std::numeric_limits<float>::infinity());
    const float inv = 1.0f / exp_row(si, n, scale);
    // Rounded into a row of whole vectors (0 past the diagonal: exp gave 0 there), then copied into att.
    bf16* pi = reinterpret_cast<bf16*>(pp) + i * Tp;
    for (int64_t j = 0; j < n; ++j) store(pi[j], si[j] * inv);
    std::fill(pi + n, pi + Tp, bf16{0});
    std::copy(pi, pi + T_, att + i * T_);
  }
  // out = P V: the row block [r0, r1) sees the keys [0, r1) (a pair past r1 - 1 meets P's zeros).
  tile::rows_times<PairTile>(
      y, Hp, Pairs{values(pp), Tp, 2}, PairRows{vp, Hp}, T_, [Hp](int64_t, int64_t) { return Hp; },
      [](int64_t) { return int64_t(0); }, [](int64_t r1) { return (r1 + 1) / 2; });
  narrow(o, ldo, y, Hp, T_, HS);
}

void head_backward_pairs(bf16* dq, bf16* dk, bf16* dv, int64_t ldd, const bf16* dout, int64_t ldo, const bf16* q,
                         const bf16* k, const bf16* v, int64_t ld, const bf16* att, int64_t T_, int64_t HS,
                         float scale) {
  using tile::padded;
  const int64_t Tp = padded(T_), Hp = padded(HS), Th = (T_ + 1) / 2, Hh = HS / 2;
  // The products' row blocks [r0, r1): columns up to the diagonal or all; k (in pairs) over the head, the keys up
  // to r1, or the queries from r0 (a pair reaching past the causal range meets zeros of P or dS).
  const auto to_diagonal = [](int64_t, int64_t r1) { return padded(r1); };
  const auto all_cols = [Hp](int64_t, int64_t) { return Hp; };
  const auto from_zero = [](int64_t) { return int64_t(0); };
  const auto head_pairs = [Hh](int64_t) { return Hh; };
  const auto to_r1 = [](int64_t r1) { return (r1 + 1) / 2; };
  const auto from_r0 = [](int64_t r0) { return r0 / 2; };
  const auto to_end = [Th](int64_t) { return Th; };  // the queries from r0 on
  const int64_t n_tt = lines(Th * Tp), n_th = lines(Th * Hp), n_s = lines(T_ * Tp), n_p = lines(T_ * T_);
  float* base = thread_scratch(3 * n_tt + lines(Hh * Tp) + 4 * n_th + n_s + n_p + lines(T_ * Hp));
  uint32_t *pt = reinterpret_cast<uint32_t*>(base), *dst = pt + n_tt, *ds = dst + n_tt, *vt = ds + n_tt;
  uint32_t *gp = vt + lines(Hh * Tp), *kp = gp + n_th, *qp = kp + n_th;
  float *dp = reinterpret_cast<float*>(qp + n_th), *pf = dp + n_s, *y = pf + n_p;
  pair_tile::pack_pair_rows(pt, Tp, att, T_, T_, T_);  // P^T as the left-hand operand: pair (j, kk) at pt[kk Tp + j]
  pair_tile::pack_pair_rows(gp, Hp, dout, ldo, T_, HS);
  pair_tile::pack_pair_columns(vt, Tp, v, ld, T_, HS);  // V^T
  pair_tile::pack_pair_rows(kp, Hp, k, ld, T_, HS);
  pair_tile::pack_pair_rows(qp, Hp, q, ld, T_, HS);
  // dV = P^T dO: key row j sees the queries [j, T) (from the pair holding j; P is 0 above the diagonal).
  tile::rows_times<PairTile>(y, Hp, Pairs{values(pt), 2, 2 * Tp}, PairRows{gp, Hp}, T_, all_cols, from_r0, to_end);
  narrow(dv, ldd, y, Hp, T_, HS);
  // dP = dO V^T, the columns [0, r1) of the row block [r0, r1); dS in place, in fp32, then rounded.
  tile::rows_times<PairTile>(dp, Tp, Pairs{dout, ldo, 2}, PairRows{vt, Tp}, T_, to_diagonal, from_zero, head_pairs);
  for (int64_t i = 0; i < T_ * T_; ++i) pf[i] = load(att[i]);
  causal_softmax_backward(dp, Tp, pf, T_, scale);
  bf16* dsb = reinterpret_cast<bf16*>(ds);  // dS rows of whole pairs: dQ's left-hand operand
  for (int64_t i = 0; i < T_; ++i) {
    for (int64_t j = 0; j < T_; ++j) store(dsb[i * 2 * Th + j], dp[i * Tp + j]);
    if (T_ % 2) dsb[i * 2 * Th + T_] = bf16{0};
  }
  pair_tile::pack_pair_rows(dst, Tp, dsb, 2 * Th, T_, T_);  // dS^T: dK's
  // dQ = dS K (query row i sees the keys [0, i]); dK = dS^T Q (key row j sees the queries [j, T)).
  tile::rows_times<PairTile>(y, Hp, Pairs{dsb, 2 * Th, 2}, PairRows{kp, Hp}, T_, all_cols, from_zero, to_r1);
  narrow(dq, ldd, y, Hp, T_, HS);
  tile::rows_times<PairTile>(y, Hp, Pairs{values(dst), 2, 2 * Tp}, PairRows{qp, Hp}, T_, all_cols, from_r0, to_end);
  narrow(dk, ldd, y, Hp, T_, HS);
}
#endif
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
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    if constexpr (std::is_same_v<S, bf16>)
      if (HS % 2 == 0) {  // the pair tiles
        head_forward_pairs(o, C, a, q, q + C, q + 2 * C, C3, T_, HS, scale);
        continue;
      }
#endif
    if constexpr (std::is_same_v<S, double>) {  // the fp64 reference: Eigen's GEMMs
      causal_abt(a, q, C3, q + C, C3, T_, HS);
      causal_softmax(a, T_, scale);
      lower_times(o, C, static_cast<const S*>(a), q + 2 * C, C3, T_, HS);
    } else {
      head_forward(o, C, a, q, q + C, q + 2 * C, C3, T_, HS, scale);
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
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    if constexpr (std::is_same_v<S, bf16>)
      if (HS % 2 == 0) {  // the pair tiles
        head_backward_pairs(dq, dq + C, dq + 2 * C, C3, dO, C, q, q + C, q + 2 * C, C3, p, T_, HS, scale);
        continue;
      }
#endif
    if constexpr (std::is_same_v<S, double>) {
      A* d = datt + bh * T_ * T_;
      // dV = P^T dO; dP = dO V^T (only j <= i is needed: P is 0 above the diagonal, so dS is too).
      lower_t_times(dq + 2 * C, C3, p, dO, C, T_, HS);
      causal_abt(d, dO, C, q + 2 * C, C3, T_, HS);
      causal_softmax_backward(d, T_, p, T_, scale);
      // dQ = dS K, dK = dS^T Q.
      lower_times(dq, C3, static_cast<const A*>(d), q + C, C3, T_, HS);
      lower_t_times(dq + C, C3, static_cast<const A*>(d), q, C3, T_, HS);
    } else {
      head_backward(dq, dq + C, dq + 2 * C, C3, dO, C, q, q + C, q + 2 * C, C3, p, T_, HS, scale);
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
