// GPU causal flash attention (FlashAttention-2 style), forward and backward, without the T x T matrix.
//
// Notation per (batch b, head h): Q, K, V [T, HS] are strided views of qkv (row t at qkv[b, t, part*C + h*HS]),
// scores S = Q K^T * scale (scale = 1/sqrt(HS)), causal: key j is visible to query i when j <= i.
// Forward: O = softmax(S) V, computed with an online softmax over key tiles; saved: lse_i = log sum_j exp(S_ij).
// Backward (from dO, O, lse): P = exp(S - lse) recomputed, D_i = sum_k dO_ik O_ik, dV = P^T dO, dP = dO V^T,
// dS = P * (dP - D) * scale, dQ = dS K, dK = dS^T Q. Two kernels, no atomics, so results are deterministic:
// one over key tiles (dK, dV: each block owns its keys) and one over query tiles (dQ: each block owns its queries,
// recomputing S and dP; two extra tile products instead of fp32 atomics and a [B, T, C] scratch).
//
// Two implementations:
//  * bf16 / fp16: tensor cores through nvcuda::wmma (16x16x16 fragments, fp32 accumulators). A block has 4 warps
//    and a tile of 64 rows (queries, or keys for dK/dV); warp w owns rows 16w .. 16w+15 of it. The other operand
//    comes in tiles of 64 rows. Shared memory holds the tiles in 16-bit (row stride HS + 8 elements: the 16-byte
//    stagger spreads rows over banks and keeps WMMA's 32-byte pointer alignment), per-warp fp32 score tiles
//    [16][68] and 16-bit probability tiles [16][72]. Element-wise work (mask, softmax, dS) is done on the fp32
//    tiles in shared memory, two lanes per row (lane = 2 r + half; the half takes columns half, half + 2, ...).
//  * fp32 / fp64: CUDA cores. 8 warps and 16 rows per block (2 rows per warp), tiles of 32 of the other operand in
//    shared memory with a row stride of HS + 1 (lane j reads row j: conflict-free). Lane j computes the dot product
//    for key (or query) j of the tile; each lane keeps HS/32 (<= 4) columns of its rows' accumulators.
// Every kernel runs on compute_stream(), each launch followed by CUDA_LAUNCH_CHECK().
// In builds with cuDNN, 16-bit calls go to cuDNN's fused attention instead (attention_cudnn.h) where it takes the
// shape and every pointer is 16-byte aligned: about 7x faster on Hopper. Its softmax stats are the same lse, so
// either backward can follow either forward.
#include <mma.h>

#include <atomic>
#include <cmath>
#include <initializer_list>

#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/common.cuh"
#if MESHTRAIN_WITH_CUDNN
#include "kernels/cuda/attention_cudnn.h"
#endif

namespace mt::kernels::gpu {
namespace {
using namespace nvcuda;

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxHeadSize = 128;

__device__ __forceinline__ float exp_acc(float x) { return expf(x); }
__device__ __forceinline__ double exp_acc(double x) { return exp(x); }
__device__ __forceinline__ float log_acc(float x) { return logf(x); }
__device__ __forceinline__ double log_acc(double x) { return log(x); }

template <typename A>
__device__ __forceinline__ A warp_max_acc(A v) {
  for (int o = 16; o > 0; o >>= 1) {
    const A other = __shfl_xor_sync(kFullMask, v, o);  // every lane shuffles, then compares
    v = v > other ? v : other;
  }
  return v;
}
template <typename A>
__device__ __forceinline__ A warp_sum_acc(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Opts a kernel into more than 48 KiB of dynamic shared memory (once per instantiation: the caller's static).
template <typename Kernel>
bool allow_shared_bytes(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  return true;
}

// ------------------------------------------------------------------------------------------------------------
// D_i = sum_k dO_ik O_ik per (b, h, i), in the accumulation type: one warp per row, lanes over the head's columns.
template <typename S>
__global__ void __launch_bounds__(256)
    row_dot_kernel(acc_t<S>* delta, const S* dout, const S* out, int T, int C, int NH, int HS, int64_t rows) {
  using A = acc_t<S>;
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;  // (b, t, h), h fastest
  if (row >= rows) return;                                                          // warp-uniform
  const int lane = threadIdx.x % 32;
  const int h = static_cast<int>(row % NH);
  const int64_t bt = row / NH, b = bt / T, t = bt % T;
  const int64_t at = bt * C + int64_t(h) * HS;
  A sum = 0;
  for (int d = lane; d < HS; d += 32) sum += to_acc(dout[at + d]) * to_acc(out[at + d]);
  sum = warp_sum_acc(sum);
  if (lane == 0) delta[(b * NH + h) * T + t] = sum;
}

// ------------------------------------------------------------------------------------------------------------
// Tensor-core path (bf16, fp16).
constexpr int kTile = 64;     // rows of the block's own tile and of each tile of the other operand
constexpr int kWarps = 4;     // warp w owns rows 16w .. 16w+15 of the block's tile
constexpr int kThreads = kWarps * 32;
constexpr int kLdS = kTile + 4;  // fp32 [16][kTile] score tiles: a multiple of 4 (WMMA's fp32 ldm rule)
constexpr int kLdP = kTile + 8;  // 16-bit [16][kTile] probability tiles: a multiple of 8 (16-bit ldm rule)

template <typename S> using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, S, wmma::row_major>;
template <typename S> using FragAColMajor = wmma::fragment<wmma::matrix_a, 16, 16, 16, S, wmma::col_major>;
template <typename S> using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, S, wmma::row_major>;
template <typename S> using FragBColMajor = wmma::fragment<wmma::matrix_b, 16, 16, 16, S, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Shared-memory geometry for one head size. All region sizes are multiples of 32 bytes, so every fragment pointer
// below is 32-byte aligned as WMMA requires.
template <int HS>
struct TcGeometry {
  static_assert(HS % 16 == 0 && HS <= kMaxHeadSize, "head size must be a multiple of 16, at most 128");
  static constexpr int kLd = HS + 8;                                // 16-bit operand tiles [kTile][kLd]
  static constexpr int kLdO = HS + 4;                               // fp32 output accumulators [16][kLdO]
  static constexpr size_t kTileBytes = size_t(kTile) * kLd * 2;     // one 16-bit operand tile
  static constexpr size_t kScoreBytes = size_t(kWarps) * 16 * kLdS * 4;  // every warp's fp32 [16][kLdS]
  static constexpr size_t kProbBytes = size_t(kWarps) * 16 * kLdP * 2;   // every warp's 16-bit [16][kLdP]
  static constexpr size_t kOutBytes = size_t(kWarps) * 16 * kLdO * 4;    // every warp's fp32 [16][kLdO]
  // forward: Q, K, V tiles, scores, probabilities, output accumulators (HS 64: 70 KiB; HS 128: 110 KiB)
  static constexpr size_t kForwardBytes = 3 * kTileBytes + kScoreBytes + kProbBytes + kOutBytes;
  // dQ: Q, dO, K, V tiles, scores (then P), dP, dS (HS 64: 79 KiB; HS 128: 111 KiB)
  static constexpr size_t kDqBytes = 4 * kTileBytes + 2 * kScoreBytes + kProbBytes;
  // dK/dV: K, V, Q, dO tiles, S^T (then P^T), dP^T, P^T and dS^T in 16 bits, lse and D of the query tile
  // (HS 64: 88.5 KiB; HS 128: 120.5 KiB)
  static constexpr size_t kDkvBytes = 4 * kTileBytes + 2 * kScoreBytes + 2 * kProbBytes + 2 * kTile * 4;
};

// Rows [row0, row0 + kTile) of a [T, HS] strided view (row t at src + t * ld) into a [kTile][kLd] tile; rows at or
// beyond T are zero (never NaN garbage: a zero probability times a NaN value would still be NaN). `vec`: src and
// ld allow 16-byte loads (8 elements).
template <typename S, int HS>
__device__ __forceinline__ void load_tile(S* tile, const S* src, int64_t ld, int row0, int T, bool vec) {
  constexpr int kLd = TcGeometry<HS>::kLd;
  if (vec) {
    constexpr int kChunks = HS / 8;
    for (int c = threadIdx.x; c < kTile * kChunks; c += blockDim.x) {
      const int r = c / kChunks, k = (c % kChunks) * 8, t = row0 + r;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (t < T) v = *reinterpret_cast<const uint4*>(src + int64_t(t) * ld + k);
      *reinterpret_cast<uint4*>(tile + r * kLd + k) = v;
    }
  } else {
    for (int e = threadIdx.x; e < kTile * HS; e += blockDim.x) {
      const int r = e / HS, k = e % HS, t = row0 + r;
      tile[r * kLd + k] = t < T ? src[int64_t(t) * ld + k] : from_acc<S>(0.0f);
    }
  }
}

// acc [16 x 16] = sum over HS of a_rows[16][HS] (row-major, ld) times b_rows[16][HS]^T: a 16 x 16 block of
// A B^T where both operands are stored by rows (Q K^T, dO V^T, K Q^T, V dO^T).
template <typename S, int HS>
__device__ __forceinline__ void rows_times_rows_t(FragAcc& acc, const S* a_rows, const S* b_rows) {
  constexpr int kLd = TcGeometry<HS>::kLd;
  wmma::fill_fragment(acc, 0.0f);
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) {
    FragA<S> a;
    FragBColMajor<S> b;  // B[k][n] = b_rows[n][k]
    wmma::load_matrix_sync(a, a_rows + kk * 16, kLd);
    wmma::load_matrix_sync(b, b_rows + kk * 16, kLd);
    wmma::mma_sync(acc, a, b, acc);
  }
}

// Forward. Grid (B*NH, query tiles), the last query tiles (most key tiles) first. Per warp and key tile: S (16 x 64)
// by tensor cores into fp32 shared memory; the online softmax there (running max m and sum l per row, kept by the
// row's two lanes); the 16-bit P; then O (fp32 in shared memory, rescaled by exp(m_old - m_new)) += P V.
template <typename S, int HS>
__global__ void __launch_bounds__(kThreads)
    flash_forward_tc(S* out, float* lse, const S* qkv, int T, int C, int NH, float scale, bool vec) {
  using G = TcGeometry<HS>;
  constexpr int kLd = G::kLd, kLdO = G::kLdO;
  extern __shared__ __align__(128) unsigned char smem[];
  S* q_s = reinterpret_cast<S*>(smem);
  S* k_s = reinterpret_cast<S*>(smem + G::kTileBytes);
  S* v_s = reinterpret_cast<S*>(smem + 2 * G::kTileBytes);
  float* s_all = reinterpret_cast<float*>(smem + 3 * G::kTileBytes);
  S* p_all = reinterpret_cast<S*>(smem + 3 * G::kTileBytes + G::kScoreBytes);
  float* o_all = reinterpret_cast<float*>(smem + 3 * G::kTileBytes + G::kScoreBytes + G::kProbBytes);

  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int qt = gridDim.y - 1 - blockIdx.y, q0 = qt * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane >> 1, half = lane & 1;  // this lane's row of the warp's 16, and its half of the columns
  const int64_t C3 = 3 * int64_t(C);
  const S* q_src = qkv + int64_t(b) * T * C3 + int64_t(h) * HS;
  float* s_w = s_all + warp * 16 * kLdS;
  S* p_w = p_all + warp * 16 * kLdP;
  float* o_w = o_all + warp * 16 * kLdO;
  const int i = q0 + warp * 16 + r;  // this lane's query

  load_tile<S, HS>(q_s, q_src, C3, q0, T, vec);
  for (int c = half; c < HS; c += 2) o_w[r * kLdO + c] = 0.0f;
  float m = -INFINITY, l = 0.0f;

  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous K, V tiles
    load_tile<S, HS>(k_s, q_src + C, C3, k0, T, vec);
    load_tile<S, HS>(v_s, q_src + 2 * C, C3, k0, T, vec);
    __syncthreads();

#pragma unroll
    for (int j = 0; j < kTile / 16; ++j) {
      FragAcc acc;
      rows_times_rows_t<S, HS>(acc, q_s + warp * 16 * kLd, k_s + j * 16 * kLd);
      wmma::store_matrix_sync(s_w + j * 16, acc, kLdS, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax of row r. Every processed tile has key k0 <= q0 <= i, so a row's max is finite after the
    // first tile; the guard keeps exp(-inf - -inf) out anyway.
    float* srow = s_w + r * kLdS;
    float tile_max = -INFINITY;
    for (int c = half; c < kTile; c += 2) {
      const int key = k0 + c;
      const float s = (key <= i && key < T) ? srow[c] * scale : -INFINITY;
      srow[c] = s;
      tile_max = fmaxf(tile_max, s);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const float m_base = m_new == -INFINITY ? 0.0f : m_new;
    const float alpha = expf(m - m_base);
    float tile_sum = 0.0f;
    S* prow = p_w + r * kLdP;
    for (int c = half; c < kTile; c += 2) {
      const float p = expf(srow[c] - m_base);  // 0 where masked (-inf)
      prow[c] = from_acc<S>(p);
      tile_sum += p;
    }
    tile_sum += __shfl_xor_sync(kFullMask, tile_sum, 1);
    l = l * alpha + tile_sum;
    m = m_new;
    for (int c = half; c < HS; c += 2) o_w[r * kLdO + c] *= alpha;
    __syncwarp();

    // O_w [16 x HS] += P_w [16 x 64] V [64 x HS], accumulated in place in shared memory.
#pragma unroll
    for (int j = 0; j < HS / 16; ++j) {
      FragAcc acc;
      wmma::load_matrix_sync(acc, o_w + j * 16, kLdO, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA<S> a;
        FragB<S> bv;
        wmma::load_matrix_sync(a, p_w + kk * 16, kLdP);
        wmma::load_matrix_sync(bv, v_s + kk * 16 * kLd + j * 16, kLd);
        wmma::mma_sync(acc, a, bv, acc);
      }
      wmma::store_matrix_sync(o_w + j * 16, acc, kLdO, wmma::mem_row_major);
    }
    __syncwarp();
  }

  if (i < T) {
    const float inv_l = 1.0f / l;
    S* orow = out + (int64_t(b) * T + i) * C + int64_t(h) * HS;
    for (int c = half; c < HS; c += 2) orow[c] = from_acc<S>(o_w[r * kLdO + c] * inv_l);
    if (half == 0) lse[int64_t(bh) * T + i] = m + logf(l);
  }
}

// dQ. Grid (B*NH, query tiles). Per warp and key tile: S and dP (16 x 64 each) by tensor cores, then
// dS = P (dP - D) scale in 16 bits, then dQ_w [16 x HS] += dS [16 x 64] K [64 x HS] in register fragments.
template <typename S, int HS>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dq_tc(S* dqkv, const S* dout, const S* qkv, const float* lse, const float* delta, int T, int C,
                         int NH, float scale, bool vec_qkv, bool vec_dout) {
  using G = TcGeometry<HS>;
  constexpr int kLd = G::kLd;
  extern __shared__ __align__(128) unsigned char smem[];
  S* q_s = reinterpret_cast<S*>(smem);
  S* do_s = reinterpret_cast<S*>(smem + G::kTileBytes);
  S* k_s = reinterpret_cast<S*>(smem + 2 * G::kTileBytes);
  S* v_s = reinterpret_cast<S*>(smem + 3 * G::kTileBytes);
  float* s_all = reinterpret_cast<float*>(smem + 4 * G::kTileBytes);
  float* dp_all = reinterpret_cast<float*>(smem + 4 * G::kTileBytes + G::kScoreBytes);
  S* ds_all = reinterpret_cast<S*>(smem + 4 * G::kTileBytes + 2 * G::kScoreBytes);

  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int qt = gridDim.y - 1 - blockIdx.y, q0 = qt * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane >> 1, half = lane & 1;
  const int64_t C3 = 3 * int64_t(C);
  const S* q_src = qkv + int64_t(b) * T * C3 + int64_t(h) * HS;
  const S* do_src = dout + int64_t(b) * T * C + int64_t(h) * HS;
  float* s_w = s_all + warp * 16 * kLdS;
  float* dp_w = dp_all + warp * 16 * kLdS;
  S* ds_w = ds_all + warp * 16 * kLdP;
  const int i = q0 + warp * 16 + r;
  const float lse_i = i < T ? lse[int64_t(bh) * T + i] : 0.0f;
  const float d_i = i < T ? delta[int64_t(bh) * T + i] : 0.0f;

  load_tile<S, HS>(q_s, q_src, C3, q0, T, vec_qkv);
  load_tile<S, HS>(do_s, do_src, C, q0, T, vec_dout);
  FragAcc dq[HS / 16];
#pragma unroll
  for (int j = 0; j < HS / 16; ++j) wmma::fill_fragment(dq[j], 0.0f);

  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();
    load_tile<S, HS>(k_s, q_src + C, C3, k0, T, vec_qkv);
    load_tile<S, HS>(v_s, q_src + 2 * C, C3, k0, T, vec_qkv);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kTile / 16; ++j) {
      FragAcc acc;
      rows_times_rows_t<S, HS>(acc, q_s + warp * 16 * kLd, k_s + j * 16 * kLd);
      wmma::store_matrix_sync(s_w + j * 16, acc, kLdS, wmma::mem_row_major);
      rows_times_rows_t<S, HS>(acc, do_s + warp * 16 * kLd, v_s + j * 16 * kLd);
      wmma::store_matrix_sync(dp_w + j * 16, acc, kLdS, wmma::mem_row_major);
    }
    __syncwarp();
    for (int c = half; c < kTile; c += 2) {
      const int key = k0 + c;
      const bool visible = key <= i && i < T;  // key <= i < T
      const float p = visible ? expf(s_w[r * kLdS + c] * scale - lse_i) : 0.0f;
      ds_w[r * kLdP + c] = from_acc<S>(p * (dp_w[r * kLdS + c] - d_i) * scale);
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < HS / 16; ++j) {
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA<S> a;
        FragB<S> bk;
        wmma::load_matrix_sync(a, ds_w + kk * 16, kLdP);
        wmma::load_matrix_sync(bk, k_s + kk * 16 * kLd + j * 16, kLd);
        wmma::mma_sync(dq[j], a, bk, dq[j]);
      }
    }
  }

  // Each 16 x 16 fragment goes through the warp's score tile to global memory (rows below T only).
#pragma unroll
  for (int j = 0; j < HS / 16; ++j) {
    __syncwarp();
    wmma::store_matrix_sync(s_w, dq[j], kLdS, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int rr = e / 16, cc = e % 16, t = q0 + warp * 16 + rr;
      if (t < T) dqkv[(int64_t(b) * T + t) * C3 + int64_t(h) * HS + j * 16 + cc] = from_acc<S>(s_w[rr * kLdS + cc]);
    }
  }
}

// dK, dV. Grid (B*NH, key tiles), the first key tiles (most query tiles) first. Warp w owns keys 16w .. 16w+15;
// per query tile: S^T and dP^T (16 keys x 64 queries) by tensor cores, P^T and dS^T in 16 bits, then
// dV_w += P^T dO and dK_w += dS^T Q, both [16 x HS] in register fragments.
template <typename S, int HS>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dkdv_tc(S* dqkv, const S* dout, const S* qkv, const float* lse, const float* delta, int T, int C,
                           int NH, float scale, bool vec_qkv, bool vec_dout) {
  using G = TcGeometry<HS>;
  constexpr int kLd = G::kLd;
  extern __shared__ __align__(128) unsigned char smem[];
  S* k_s = reinterpret_cast<S*>(smem);
  S* v_s = reinterpret_cast<S*>(smem + G::kTileBytes);
  S* q_s = reinterpret_cast<S*>(smem + 2 * G::kTileBytes);
  S* do_s = reinterpret_cast<S*>(smem + 3 * G::kTileBytes);
  unsigned char* rest = smem + 4 * G::kTileBytes;
  float* st_all = reinterpret_cast<float*>(rest);
  float* dpt_all = reinterpret_cast<float*>(rest + G::kScoreBytes);
  S* pt_all = reinterpret_cast<S*>(rest + 2 * G::kScoreBytes);
  S* dst_all = reinterpret_cast<S*>(rest + 2 * G::kScoreBytes + G::kProbBytes);
  float* lse_s = reinterpret_cast<float*>(rest + 2 * G::kScoreBytes + 2 * G::kProbBytes);
  float* delta_s = lse_s + kTile;

  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int kt = blockIdx.y, k0 = kt * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane >> 1, half = lane & 1;  // this lane's key row of the warp's 16, and its half of the queries
  const int64_t C3 = 3 * int64_t(C);
  const S* q_src = qkv + int64_t(b) * T * C3 + int64_t(h) * HS;
  const S* do_src = dout + int64_t(b) * T * C + int64_t(h) * HS;
  float* st_w = st_all + warp * 16 * kLdS;
  float* dpt_w = dpt_all + warp * 16 * kLdS;
  S* pt_w = pt_all + warp * 16 * kLdP;
  S* dst_w = dst_all + warp * 16 * kLdP;
  const int j_key = k0 + warp * 16 + r;

  load_tile<S, HS>(k_s, q_src + C, C3, k0, T, vec_qkv);
  load_tile<S, HS>(v_s, q_src + 2 * C, C3, k0, T, vec_qkv);
  FragAcc dk[HS / 16], dv[HS / 16];
#pragma unroll
  for (int j = 0; j < HS / 16; ++j) wmma::fill_fragment(dk[j], 0.0f), wmma::fill_fragment(dv[j], 0.0f);

  const int n_query_tiles = (T + kTile - 1) / kTile;
  for (int qt = kt; qt < n_query_tiles; ++qt) {  // query tiles before kt see none of these keys
    const int q0 = qt * kTile;
    __syncthreads();
    load_tile<S, HS>(q_s, q_src, C3, q0, T, vec_qkv);
    load_tile<S, HS>(do_s, do_src, C, q0, T, vec_dout);
    for (int e = threadIdx.x; e < kTile; e += blockDim.x) {
      const int t = q0 + e;
      lse_s[e] = t < T ? lse[int64_t(bh) * T + t] : 0.0f;
      delta_s[e] = t < T ? delta[int64_t(bh) * T + t] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kTile / 16; ++j) {
      FragAcc acc;
      rows_times_rows_t<S, HS>(acc, k_s + warp * 16 * kLd, q_s + j * 16 * kLd);  // S^T = K Q^T
      wmma::store_matrix_sync(st_w + j * 16, acc, kLdS, wmma::mem_row_major);
      rows_times_rows_t<S, HS>(acc, v_s + warp * 16 * kLd, do_s + j * 16 * kLd);  // dP^T = V dO^T
      wmma::store_matrix_sync(dpt_w + j * 16, acc, kLdS, wmma::mem_row_major);
    }
    __syncwarp();
    for (int c = half; c < kTile; c += 2) {
      const int i = q0 + c;
      const bool visible = j_key <= i && i < T;  // j <= i < T (so the key is below T too)
      const float p = visible ? expf(st_w[r * kLdS + c] * scale - lse_s[c]) : 0.0f;
      pt_w[r * kLdP + c] = from_acc<S>(p);
      dst_w[r * kLdP + c] = from_acc<S>(p * (dpt_w[r * kLdS + c] - delta_s[c]) * scale);
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < HS / 16; ++j) {
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA<S> a;
        FragB<S> bm;
        wmma::load_matrix_sync(a, pt_w + kk * 16, kLdP);
        wmma::load_matrix_sync(bm, do_s + kk * 16 * kLd + j * 16, kLd);
        wmma::mma_sync(dv[j], a, bm, dv[j]);
        wmma::load_matrix_sync(a, dst_w + kk * 16, kLdP);
        wmma::load_matrix_sync(bm, q_s + kk * 16 * kLd + j * 16, kLd);
        wmma::mma_sync(dk[j], a, bm, dk[j]);
      }
    }
  }

  const int64_t row0 = int64_t(b) * T;
#pragma unroll
  for (int j = 0; j < HS / 16; ++j) {
#pragma unroll
    for (int part = 1; part <= 2; ++part) {
      __syncwarp();
      wmma::store_matrix_sync(st_w, part == 1 ? dk[j] : dv[j], kLdS, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        const int rr = e / 16, cc = e % 16, t = k0 + warp * 16 + rr;
        if (t < T)
          dqkv[(row0 + t) * C3 + int64_t(part) * C + int64_t(h) * HS + j * 16 + cc] =
              from_acc<S>(st_w[rr * kLdS + cc]);
      }
    }
  }
}

template <typename S, int HS>
void launch_tc(bool forward, const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& dqkv,
               const Tensor& delta, const Tensor& dout, int B, int T, int C, int NH) {
  using G = TcGeometry<HS>;
  const float scale = 1.0f / std::sqrt(float(HS));
  const dim3 grid(B * NH, (T + kTile - 1) / kTile);
  const bool vec_qkv = aligned16(qkv.data());
  if (forward) {
    static const bool ready = allow_shared_bytes(flash_forward_tc<S, HS>, G::kForwardBytes);
    (void)ready;
    flash_forward_tc<S, HS><<<grid, kThreads, G::kForwardBytes, compute_stream()>>>(
        ptr<S>(out), ptr<float>(lse), ptr<S>(qkv), T, C, NH, scale, vec_qkv);
    CUDA_LAUNCH_CHECK();
    return;
  }
  static const bool ready = allow_shared_bytes(flash_backward_dq_tc<S, HS>, G::kDqBytes) &&
                            allow_shared_bytes(flash_backward_dkdv_tc<S, HS>, G::kDkvBytes);
  (void)ready;
  const bool vec_dout = aligned16(dout.data());
  flash_backward_dkdv_tc<S, HS><<<grid, kThreads, G::kDkvBytes, compute_stream()>>>(
      ptr<S>(dqkv), ptr<S>(dout), ptr<S>(qkv), ptr<float>(lse), ptr<float>(delta), T, C, NH, scale, vec_qkv,
      vec_dout);
  CUDA_LAUNCH_CHECK();
  flash_backward_dq_tc<S, HS><<<grid, kThreads, G::kDqBytes, compute_stream()>>>(
      ptr<S>(dqkv), ptr<S>(dout), ptr<S>(qkv), ptr<float>(lse), ptr<float>(delta), T, C, NH, scale, vec_qkv,
      vec_dout);
  CUDA_LAUNCH_CHECK();
}

// ------------------------------------------------------------------------------------------------------------
// CUDA-core path (fp32, fp64). A block: 8 warps, 16 own rows (2 per warp); tiles of 32 rows of the other operand.
constexpr int kScalarWarps = 8, kScalarRowsPerWarp = 2, kScalarRows = kScalarWarps * kScalarRowsPerWarp;
constexpr int kScalarTile = 32;                      // one row of the other operand per lane
constexpr int kScalarCols = kMaxHeadSize / 32;       // head columns per lane: d = lane + 32 x, x < 4
constexpr int kScalarThreads = kScalarWarps * 32;

// Shared bytes: two [32][HS+1] tiles of the other operand and two [16][HS] tiles of the block's rows, plus 64
// values (lse and D of a query tile); fp64 at HS 128: 98 KiB.
template <typename A>
size_t scalar_shared_bytes(int HS) {
  return sizeof(A) * (2 * size_t(kScalarTile) * (HS + 1) + 2 * size_t(kScalarRows) * HS + 2 * kScalarTile);
}

// Rows [row0, row0 + n) of a strided [T, HS] view into a tile with row stride ld, widened; zero at or beyond T.
template <typename S, typename A>
__device__ __forceinline__ void load_rows_acc(A* tile, int ld, const S* src, int64_t src_ld, int row0, int n, int T,
                                              int HS) {
  for (int e = threadIdx.x; e < n * HS; e += blockDim.x) {
    const int r = e / HS, k = e % HS, t = row0 + r;
    tile[r * ld + k] = t < T ? to_acc(src[int64_t(t) * src_ld + k]) : A(0);
  }
}

// Forward. Grid (B*NH, query blocks of 16), the last first. Lane j scores key k0 + j of the tile for the warp's
// row; one max and one sum per row and tile by shuffles; then every lane adds p_j v_j to its columns.
template <typename S>
__global__ void __launch_bounds__(kScalarThreads)
    flash_forward_scalar(S* out, acc_t<S>* lse, const S* qkv, int T, int C, int NH, int HS, acc_t<S> scale) {
  using A = acc_t<S>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* k_s = reinterpret_cast<A*>(smem_raw);  // [32][HS+1]
  A* v_s = k_s + kScalarTile * (HS + 1);    // [32][HS+1]
  A* q_s = v_s + kScalarTile * (HS + 1);    // [16][HS]
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kScalarRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t C3 = 3 * int64_t(C);
  const S* src = qkv + int64_t(b) * T * C3 + int64_t(h) * HS;
  load_rows_acc(q_s, HS, src, C3, q0, kScalarRows, T, HS);

  A m[kScalarRowsPerWarp], l[kScalarRowsPerWarp], o[kScalarRowsPerWarp][kScalarCols];
#pragma unroll
  for (int rr = 0; rr < kScalarRowsPerWarp; ++rr) {
    m[rr] = -INFINITY, l[rr] = 0;
#pragma unroll
    for (int x = 0; x < kScalarCols; ++x) o[rr][x] = 0;
  }
  const int last_key = min(T - 1, q0 + kScalarRows - 1);
  for (int k0 = 0; k0 <= last_key; k0 += kScalarTile) {
    __syncthreads();
    load_rows_acc(k_s, HS + 1, src + C, C3, k0, kScalarTile, T, HS);
    load_rows_acc(v_s, HS + 1, src + 2 * C, C3, k0, kScalarTile, T, HS);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kScalarRowsPerWarp; ++rr) {
      const int row = warp * kScalarRowsPerWarp + rr, i = q0 + row;
      if (i >= T) continue;  // the whole warp shares i
      const int j = k0 + lane;
      A s = 0;
      for (int d = 0; d < HS; ++d) s += q_s[row * HS + d] * k_s[lane * (HS + 1) + d];
      const bool visible = j <= i;  // and so j < T
      s = visible ? s * scale : A(-INFINITY);
      const A m_new = max(m[rr], warp_max_acc(s));
      const A m_base = m_new == A(-INFINITY) ? A(0) : m_new;
      const A p = visible ? exp_acc(s - m_base) : A(0);
      const A alpha = exp_acc(m[rr] - m_base);
      l[rr] = l[rr] * alpha + warp_sum_acc(p);
      m[rr] = m_new;
#pragma unroll
      for (int x = 0; x < kScalarCols; ++x) o[rr][x] *= alpha;
      for (int jj = 0; jj < kScalarTile; ++jj) {
        const A pj = __shfl_sync(kFullMask, p, jj);
#pragma unroll
        for (int x = 0; x < kScalarCols; ++x) {
          const int d = lane + 32 * x;
          if (d < HS) o[rr][x] += pj * v_s[jj * (HS + 1) + d];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kScalarRowsPerWarp; ++rr) {
    const int i = q0 + warp * kScalarRowsPerWarp + rr;
    if (i >= T) continue;
    S* orow = out + (int64_t(b) * T + i) * C + int64_t(h) * HS;
#pragma unroll
    for (int x = 0; x < kScalarCols; ++x) {
      const int d = lane + 32 * x;
      if (d < HS) orow[d] = from_acc<S>(o[rr][x] / l[rr]);
    }
    if (lane == 0) lse[int64_t(bh) * T + i] = m[rr] + log_acc(l[rr]);
  }
}

// dQ. Grid (B*NH, query blocks of 16). Lane j forms S and dP for key k0 + j, then dS; dq += dS_j k_j.
template <typename S>
__global__ void __launch_bounds__(kScalarThreads)
    flash_backward_dq_scalar(S* dqkv, const S* dout, const S* qkv, const acc_t<S>* lse, const acc_t<S>* delta, int T,
                             int C, int NH, int HS, acc_t<S> scale) {
  using A = acc_t<S>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* k_s = reinterpret_cast<A*>(smem_raw);  // [32][HS+1]
  A* v_s = k_s + kScalarTile * (HS + 1);    // [32][HS+1]
  A* q_s = v_s + kScalarTile * (HS + 1);    // [16][HS]
  A* do_s = q_s + kScalarRows * HS;         // [16][HS]
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kScalarRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t C3 = 3 * int64_t(C);
  const S* src = qkv + int64_t(b) * T * C3 + int64_t(h) * HS;
  const S* do_src = dout + int64_t(b) * T * C + int64_t(h) * HS;
  load_rows_acc(q_s, HS, src, C3, q0, kScalarRows, T, HS);
  load_rows_acc(do_s, HS, do_src, C, q0, kScalarRows, T, HS);

  A lse_i[kScalarRowsPerWarp], d_i[kScalarRowsPerWarp], dq[kScalarRowsPerWarp][kScalarCols];
#pragma unroll
  for (int rr = 0; rr < kScalarRowsPerWarp; ++rr) {
    const int i = q0 + warp * kScalarRowsPerWarp + rr;
    lse_i[rr] = i < T ? lse[int64_t(bh) * T + i] : A(0);
    d_i[rr] = i < T ? delta[int64_t(bh) * T + i] : A(0);
#pragma unroll
    for (int x = 0; x < kScalarCols; ++x) dq[rr][x] = 0;
  }
  const int last_key = min(T - 1, q0 + kScalarRows - 1);
  for (int k0 = 0; k0 <= last_key; k0 += kScalarTile) {
    __syncthreads();
    load_rows_acc(k_s, HS + 1, src + C, C3, k0, kScalarTile, T, HS);
    load_rows_acc(v_s, HS + 1, src + 2 * C, C3, k0, kScalarTile, T, HS);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kScalarRowsPerWarp; ++rr) {
      const int row = warp * kScalarRowsPerWarp + rr, i = q0 + row;
      if (i >= T) continue;
      A s = 0, dp = 0;
      for (int d = 0; d < HS; ++d) {
        s += q_s[row * HS + d] * k_s[lane * (HS + 1) + d];
        dp += do_s[row * HS + d] * v_s[lane * (HS + 1) + d];
      }
      const bool visible = k0 + lane <= i;
      const A p = visible ? exp_acc(s * scale - lse_i[rr]) : A(0);
      const A ds = p * (dp - d_i[rr]) * scale;
      for (int jj = 0; jj < kScalarTile; ++jj) {
        const A dsj = __shfl_sync(kFullMask, ds, jj);
#pragma unroll
        for (int x = 0; x < kScalarCols; ++x) {
          const int d = lane + 32 * x;
          if (d < HS) dq[rr][x] += dsj * k_s[jj * (HS + 1) + d];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kScalarRowsPerWarp; ++rr) {
    const int i = q0 + warp * kScalarRowsPerWarp + rr;
    if (i >= T) continue;
    S* row = dqkv + (int64_t(b) * T + i) * C3 + int64_t(h) * HS;
#pragma unroll
    for (int x = 0; x < kScalarCols; ++x) {
      const int d = lane + 32 * x;
      if (d < HS) row[d] = from_acc<S>(dq[rr][x]);
    }
  }
}

// dK, dV. Grid (B*NH, key blocks of 16), the first (most queries) first. Lane i takes query q0 + i of the tile for
// the warp's key; dv += p_i do_i and dk += ds_i q_i.
template <typename S>
__global__ void __launch_bounds__(kScalarThreads)
    flash_backward_dkdv_scalar(S* dqkv, const S* dout, const S* qkv, const acc_t<S>* lse, const acc_t<S>* delta,
                               int T, int C, int NH, int HS, acc_t<S> scale) {
  using A = acc_t<S>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* q_s = reinterpret_cast<A*>(smem_raw);    // [32][HS+1]
  A* do_s = q_s + kScalarTile * (HS + 1);     // [32][HS+1]
  A* k_s = do_s + kScalarTile * (HS + 1);     // [16][HS]
  A* v_s = k_s + kScalarRows * HS;            // [16][HS]
  A* lse_s = v_s + kScalarRows * HS;          // [32]
  A* delta_s = lse_s + kScalarTile;           // [32]
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int k0 = blockIdx.y * kScalarRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t C3 = 3 * int64_t(C);
  const S* src = qkv + int64_t(b) * T * C3 + int64_t(h) * HS;
  const S* do_src = dout + int64_t(b) * T * C + int64_t(h) * HS;
  load_rows_acc(k_s, HS, src + C, C3, k0, kScalarRows, T, HS);
  load_rows_acc(v_s, HS, src + 2 * C, C3, k0, kScalarRows, T, HS);

  A dk[kScalarRowsPerWarp][kScalarCols], dv[kScalarRowsPerWarp][kScalarCols];
#pragma unroll
  for (int rr = 0; rr < kScalarRowsPerWarp; ++rr)
#pragma unroll
    for (int x = 0; x < kScalarCols; ++x) dk[rr][x] = 0, dv[rr][x] = 0;

  for (int q0 = k0 / kScalarTile * kScalarTile; q0 < T; q0 += kScalarTile) {  // earlier queries see none of these keys
    __syncthreads();
    load_rows_acc(q_s, HS + 1, src, C3, q0, kScalarTile, T, HS);
    load_rows_acc(do_s, HS + 1, do_src, C, q0, kScalarTile, T, HS);
    for (int e = threadIdx.x; e < kScalarTile; e += blockDim.x) {
      const int t = q0 + e;
      lse_s[e] = t < T ? lse[int64_t(bh) * T + t] : A(0);
      delta_s[e] = t < T ? delta[int64_t(bh) * T + t] : A(0);
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kScalarRowsPerWarp; ++rr) {
      const int row = warp * kScalarRowsPerWarp + rr, j = k0 + row;
      if (j >= T) continue;
      A s = 0, dp = 0;
      for (int d = 0; d < HS; ++d) {
        s += q_s[lane * (HS + 1) + d] * k_s[row * HS + d];
        dp += do_s[lane * (HS + 1) + d] * v_s[row * HS + d];
      }
      const int i = q0 + lane;
      const bool visible = j <= i && i < T;
      const A p = visible ? exp_acc(s * scale - lse_s[lane]) : A(0);
      const A ds = p * (dp - delta_s[lane]) * scale;
      for (int ii = 0; ii < kScalarTile; ++ii) {
        const A pi = __shfl_sync(kFullMask, p, ii), dsi = __shfl_sync(kFullMask, ds, ii);
#pragma unroll
        for (int x = 0; x < kScalarCols; ++x) {
          const int d = lane + 32 * x;
          if (d < HS) {
            dv[rr][x] += pi * do_s[ii * (HS + 1) + d];
            dk[rr][x] += dsi * q_s[ii * (HS + 1) + d];
          }
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kScalarRowsPerWarp; ++rr) {
    const int j = k0 + warp * kScalarRowsPerWarp + rr;
    if (j >= T) continue;
    S* row = dqkv + (int64_t(b) * T + j) * C3 + int64_t(h) * HS;
#pragma unroll
    for (int x = 0; x < kScalarCols; ++x) {
      const int d = lane + 32 * x;
      if (d < HS) row[C + d] = from_acc<S>(dk[rr][x]), row[2 * C + d] = from_acc<S>(dv[rr][x]);
    }
  }
}

template <typename S>
void launch_scalar(bool forward, const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& dqkv,
                   const Tensor& delta, const Tensor& dout, int B, int T, int C, int NH) {
  using A = acc_t<S>;
  const int HS = C / NH;
  const A scale = A(1) / std::sqrt(A(HS));
  const size_t bytes = scalar_shared_bytes<A>(kMaxHeadSize);  // sized for the largest head: one opt-in per kernel
  const dim3 grid(B * NH, (T + kScalarRows - 1) / kScalarRows);
  const size_t used = scalar_shared_bytes<A>(HS);
  if (forward) {
    static const bool ready = allow_shared_bytes(flash_forward_scalar<S>, bytes);
    (void)ready;
    flash_forward_scalar<S><<<grid, kScalarThreads, used, compute_stream()>>>(ptr<S>(out), ptr<A>(lse), ptr<S>(qkv),
                                                                             T, C, NH, HS, scale);
    CUDA_LAUNCH_CHECK();
    return;
  }
  static const bool ready = allow_shared_bytes(flash_backward_dq_scalar<S>, bytes) &&
                            allow_shared_bytes(flash_backward_dkdv_scalar<S>, bytes);
  (void)ready;
  flash_backward_dkdv_scalar<S><<<grid, kScalarThreads, used, compute_stream()>>>(
      ptr<S>(dqkv), ptr<S>(dout), ptr<S>(qkv), ptr<A>(lse), ptr<A>(delta), T, C, NH, HS, scale);
  CUDA_LAUNCH_CHECK();
  flash_backward_dq_scalar<S><<<grid, kScalarThreads, used, compute_stream()>>>(
      ptr<S>(dqkv), ptr<S>(dout), ptr<S>(qkv), ptr<A>(lse), ptr<A>(delta), T, C, NH, HS, scale);
  CUDA_LAUNCH_CHECK();
}

// Calls the tensor-core launcher instantiated for this head size.
template <typename S>
void launch_tc_for_head(int HS, bool forward, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                        const Tensor& dqkv, const Tensor& delta, const Tensor& dout, int B, int T, int C, int NH) {
  switch (HS) {
    case 16: return launch_tc<S, 16>(forward, out, lse, qkv, dqkv, delta, dout, B, T, C, NH);
    case 32: return launch_tc<S, 32>(forward, out, lse, qkv, dqkv, delta, dout, B, T, C, NH);
    case 48: return launch_tc<S, 48>(forward, out, lse, qkv, dqkv, delta, dout, B, T, C, NH);
    case 64: return launch_tc<S, 64>(forward, out, lse, qkv, dqkv, delta, dout, B, T, C, NH);
    case 80: return launch_tc<S, 80>(forward, out, lse, qkv, dqkv, delta, dout, B, T, C, NH);
    case 96: return launch_tc<S, 96>(forward, out, lse, qkv, dqkv, delta, dout, B, T, C, NH);
    case 112: return launch_tc<S, 112>(forward, out, lse, qkv, dqkv, delta, dout, B, T, C, NH);
    case 128: return launch_tc<S, 128>(forward, out, lse, qkv, dqkv, delta, dout, B, T, C, NH);
    default: MT_CHECK(false, "attention on cuda: head size {} is not a multiple of 16 up to 128", HS);
  }
}

// The checks every entry point shares: head size and the int ranges the kernels index with.
void check_dims(const char* op, int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t HS = C / NH;
  MT_CHECK(HS % 16 == 0 && HS >= 16 && HS <= kMaxHeadSize,
           "{} on cuda: head size C/n_head = {}/{} = {} must be a multiple of 16 and at most {} (the tensor-core "
           "tiles are 16 wide; GPT-2 uses 64)",
           op, C, NH, HS, kMaxHeadSize);
  // Grid (B*NH, row blocks of 16 or 64): y is limited to 65535 blocks.
  MT_CHECK(B * NH <= INT32_MAX && 3 * C <= INT32_MAX && (T + kScalarRows - 1) / kScalarRows <= 65535,
           "{} on cuda: B={} T={} C={} n_head={} out of range", op, B, T, C, NH);
}

void run(bool forward, const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& dqkv,
         const Tensor& delta, const Tensor& dout, int64_t B, int64_t T, int64_t C, int64_t NH) {
  if (B == 0 || T == 0) return;
  const int HS = static_cast<int>(C / NH);
  dispatch_dtype(qkv.dtype(), [&](auto s) {
    using S = decltype(s);
    if constexpr (std::is_same_v<S, float> || std::is_same_v<S, double>)
      launch_scalar<S>(forward, out, lse, qkv, dqkv, delta, dout, int(B), int(T), int(C), int(NH));
    else
      launch_tc_for_head<S>(HS, forward, out, lse, qkv, dqkv, delta, dout, int(B), int(T), int(C), int(NH));
  });
}

std::atomic<bool> g_allow_cudnn{true};

#if MESHTRAIN_WITH_CUDNN
// cuDNN takes 16-bit tensors whose every pointer is 16-byte aligned (its head size, a multiple of 8, keeps each
// row so); cudnn_attention_supported checks the rest.
bool on_cudnn(std::initializer_list<const Tensor*> tensors, int64_t B, int64_t T, int64_t C, int64_t NH) {
  if (!g_allow_cudnn.load(std::memory_order_relaxed)) return false;
  for (const Tensor* t : tensors)
    if (reinterpret_cast<uintptr_t>(t->data()) % 16 != 0) return false;
  return cudnn_attention_supported((*tensors.begin())->dtype(), B, T, C, NH);
}
#endif

}  // namespace

void allow_cudnn_attention(bool allowed) { g_allow_cudnn.store(allowed); }

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH) {
  check_dims("attention_forward", B, T, C, NH);
#if MESHTRAIN_WITH_CUDNN
  if (on_cudnn({&qkv, &out, &lse}, B, T, C, NH)) return cudnn_attention_forward(out, lse, qkv, B, T, C, NH);
#endif
  run(true, out, lse, qkv, Tensor(), Tensor(), Tensor(), B, T, C, NH);
}

void attention_backward(const Tensor& dqkv, const Tensor& delta, const Tensor& dout, const Tensor& qkv,
                        const Tensor& out, const Tensor& lse, int64_t B, int64_t T, int64_t C, int64_t NH) {
  check_dims("attention_backward", B, T, C, NH);
  if (B == 0 || T == 0) return;
#if MESHTRAIN_WITH_CUDNN
  if (on_cudnn({&qkv, &dqkv, &dout, &out, &lse}, B, T, C, NH))
    return cudnn_attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH);
#endif
  // D = rowsum(dO * O) first: both backward kernels read it.
  const int64_t rows = B * T * NH;
  const int warps_per_block = 8;
  dispatch_dtype(qkv.dtype(), [&](auto s) {
    using S = decltype(s);
    const int64_t blocks = (rows + warps_per_block - 1) / warps_per_block;
    MT_CHECK(blocks <= INT32_MAX, "attention_backward on cuda: {} rows is too many", rows);
    row_dot_kernel<S><<<static_cast<unsigned>(blocks), warps_per_block * 32, 0, compute_stream()>>>(
        ptr<acc_t<S>>(delta), ptr<S>(dout), ptr<S>(out), int(T), int(C), int(NH), int(C / NH), rows);
    CUDA_LAUNCH_CHECK();
  });
  run(false, Tensor(), lse, qkv, dqkv, delta, dout, B, T, C, NH);
}

}  // namespace mt::kernels::gpu
