// GPU block attention for ring attention (kernels/attention_block.h), the simplest correct version: one warp per
// row, each lane holding head elements lane, lane + 32, ... in registers, a warp-wide sum per dot product.
//  - forward: one warp per (b, h, query i): a pass over the visible keys for the row's max and sum (online), then a
//    second for sum_j round_S(exp(s_ij - lse_i)) v_j, so that the probabilities are rounded to S before the product
//    as on the CPU (kernels/attention_block.cpp).
//  - backward: one warp per (b, h, query i) for dq (it also computes D_i), and one warp per (b, kv head g, key j)
//    for dk and dv, looping over the group's query heads and the queries that see key j; it recomputes D_i rather
//    than keep a [B, NH, Tq] buffer. Every output element is written by exactly one lane: no atomics, so the results
//    do not depend on scheduling.
// The products are not on the tensor cores: ring attention on the GPU is correct first; the blocks' speed (they do
// the same FLOPs as the flash kernel) is left for later and measured in docs/cuda.md.
#include "kernels/cuda/attention_block_cuda.h"

#include <cmath>
#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/common.cuh"

namespace mt::kernels::gpu {
namespace {

constexpr int kWarps = 4;   // warps per block
constexpr int kMaxPer = 8;  // head elements per lane: head sizes up to 256

struct Dims {
  int64_t B, Tq, Tk;
  int NH, KV, HS;
};

template <typename A>
__device__ __forceinline__ A dev_exp(A x) {
  if constexpr (sizeof(A) == 8) return exp(x); else return __expf(x);
}
template <typename A>
__device__ __forceinline__ A dev_log(A x) {
  if constexpr (sizeof(A) == 8) return log(x); else return logf(x);
}

// A probability as the product that uses it sees it: rounded to S (16-bit S), else as is.
template <typename S, typename A>
__device__ __forceinline__ A round_to_storage(A p) {
  return A(to_acc(from_acc<S>(p)));
}

// One head's HS elements at p, widened: lane l holds p[l], p[l + 32], ... (0 past HS).
template <typename S, typename A>
__device__ __forceinline__ void load_row(A (&x)[kMaxPer], const S* p, int HS, int lane) {
#pragma unroll
  for (int r = 0; r < kMaxPer; ++r) {
    const int c = lane + 32 * r;
    x[r] = c < HS ? A(to_acc(p[c])) : A(0);
  }
}
template <typename A>
__device__ __forceinline__ A dot(const A (&x)[kMaxPer], const A (&y)[kMaxPer]) {
  A s = 0;
#pragma unroll
  for (int r = 0; r < kMaxPer; ++r) s += x[r] * y[r];
  return warp_sum(s);
}

template <typename S>
__global__ void __launch_bounds__(32 * kWarps) block_forward_kernel(acc_t<S>* out, acc_t<S>* lse, const S* q,
                                                                    const S* k, const S* v, Dims d, bool causal) {
  using A = acc_t<S>;
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= d.B * d.NH * d.Tq) return;
  const int64_t i = row % d.Tq, bh = row / d.Tq, b = bh / d.NH;
  const int h = int(bh % d.NH), g = h / (d.NH / d.KV);
  const int64_t C = int64_t(d.NH) * d.HS, KW = int64_t(d.KV) * d.HS;
  const A scale = A(1) / sqrt(A(d.HS));
  A qi[kMaxPer], kv[kMaxPer];
  load_row(qi, q + (b * d.Tq + i) * C + int64_t(h) * d.HS, d.HS, lane);
  const S* kb = k + b * d.Tk * KW + int64_t(g) * d.HS;
  const S* vb = v + b * d.Tk * KW + int64_t(g) * d.HS;
  const int64_t n = causal ? i + 1 : d.Tk;
  A m = -A(INFINITY), l = 0;
  for (int64_t j = 0; j < n; ++j) {
    load_row(kv, kb + j * KW, d.HS, lane);
    const A s = dot(qi, kv) * scale;
    if (s > m) l = l * dev_exp(m - s) + A(1), m = s;
    else l += dev_exp(s - m);
  }
  const A L = m + dev_log(l);
  A o[kMaxPer] = {};
  for (int64_t j = 0; j < n; ++j) {
    load_row(kv, kb + j * KW, d.HS, lane);
    const A p = round_to_storage<S>(dev_exp(dot(qi, kv) * scale - L));
    load_row(kv, vb + j * KW, d.HS, lane);
#pragma unroll
    for (int r = 0; r < kMaxPer; ++r) o[r] += p * kv[r];
  }
  A* orow = out + (b * d.Tq + i) * C + int64_t(h) * d.HS;
#pragma unroll
  for (int r = 0; r < kMaxPer; ++r)
    if (lane + 32 * r < d.HS) orow[lane + 32 * r] = o[r];
  if (lane == 0) lse[row] = L;  // row = (b * NH + h) * Tq + i: lse's [B, NH, Tq] order
}

// One thread per (b, i, h): the online-softmax merge of (out_b, lse_b) into (out, lse), as the CPU's.
template <typename A>
__global__ void block_merge_kernel(A* out, A* lse, const A* ob, const A* lb, int64_t B, int64_t Tq, int NH, int HS) {
  const int64_t n = B * Tq * NH, stride = int64_t(gridDim.x) * blockDim.x;
  const A inf = A(INFINITY);
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t bt = e / NH, b = bt / Tq, i = bt % Tq;
    const int h = int(e % NH);
    A& la = lse[(b * NH + h) * Tq + i];
    const A lbv = lb[(b * NH + h) * Tq + i];
    A* o = out + bt * NH * HS + int64_t(h) * HS;
    const A* x = ob + bt * NH * HS + int64_t(h) * HS;
    if (lbv == -inf) continue;
    if (la == -inf) {
      for (int c = 0; c < HS; ++c) o[c] = x[c];
      la = lbv;
      continue;
    }
    const A m = la > lbv ? la : lbv, L = m + log1p(exp(-fabs(la - lbv)));
    const A wa = exp(la - L), wb = exp(lbv - L);
    for (int c = 0; c < HS; ++c) o[c] = wa * o[c] + wb * x[c];
    la = L;
  }
}

// dq += sum_j dS_ij k_j, one warp per (b, h, query i).
template <typename S>
__global__ void __launch_bounds__(32 * kWarps)
    block_backward_dq_kernel(acc_t<S>* dq, const S* dout, const S* out, const acc_t<S>* lse, const S* q, const S* k,
                             const S* v, Dims d, bool causal) {
  using A = acc_t<S>;
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= d.B * d.NH * d.Tq) return;
  const int64_t i = row % d.Tq, bh = row / d.Tq, b = bh / d.NH;
  const int h = int(bh % d.NH), g = h / (d.NH / d.KV);
  const int64_t C = int64_t(d.NH) * d.HS, KW = int64_t(d.KV) * d.HS, at = (b * d.Tq + i) * C + int64_t(h) * d.HS;
  const A scale = A(1) / sqrt(A(d.HS));
  A qi[kMaxPer], gi[kMaxPer], x[kMaxPer], acc[kMaxPer] = {};
  load_row(gi, dout + at, d.HS, lane);
  load_row(x, out + at, d.HS, lane);
  const A D = dot(gi, x), L = lse[row];
  load_row(qi, q + at, d.HS, lane);
  const S* kb = k + b * d.Tk * KW + int64_t(g) * d.HS;
  const S* vb = v + b * d.Tk * KW + int64_t(g) * d.HS;
  const int64_t n = causal ? i + 1 : d.Tk;
  for (int64_t j = 0; j < n; ++j) {
    load_row(x, vb + j * KW, d.HS, lane);
    const A dp = dot(gi, x);
    load_row(x, kb + j * KW, d.HS, lane);
    const A p = round_to_storage<S>(dev_exp(dot(qi, x) * scale - L));
    const A ds = p * (dp - D) * scale;
#pragma unroll
    for (int r = 0; r < kMaxPer; ++r) acc[r] += ds * x[r];
  }
  A* dqrow = dq + at;
#pragma unroll
  for (int r = 0; r < kMaxPer; ++r)
    if (lane + 32 * r < d.HS) dqrow[lane + 32 * r] += acc[r];
}

// dk += sum dS_ij q_i and dv += sum P_ij dout_i over the group's query heads and the queries that see key j, one warp
// per (b, kv head g, key j).
template <typename S>
__global__ void __launch_bounds__(32 * kWarps)
    block_backward_dkdv_kernel(acc_t<S>* dk, acc_t<S>* dv, const S* dout, const S* out, const acc_t<S>* lse,
                               const S* q, const S* k, const S* v, Dims d, bool causal) {
  using A = acc_t<S>;
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= d.B * d.KV * d.Tk) return;
  const int64_t j = row % d.Tk, bg = row / d.Tk, b = bg / d.KV;
  const int g = int(bg % d.KV), group = d.NH / d.KV;
  const int64_t C = int64_t(d.NH) * d.HS, KW = int64_t(d.KV) * d.HS, kat = (b * d.Tk + j) * KW + int64_t(g) * d.HS;
  const A scale = A(1) / sqrt(A(d.HS));
  A kj[kMaxPer], vj[kMaxPer], qi[kMaxPer], gi[kMaxPer], oi[kMaxPer], dka[kMaxPer] = {}, dva[kMaxPer] = {};
  load_row(kj, k + kat, d.HS, lane);
  load_row(vj, v + kat, d.HS, lane);
  for (int h = g * group; h < (g + 1) * group; ++h) {
    const A* L = lse + (b * d.NH + h) * d.Tq;
    for (int64_t i = causal ? j : 0; i < d.Tq; ++i) {
      const int64_t at = (b * d.Tq + i) * C + int64_t(h) * d.HS;
      load_row(qi, q + at, d.HS, lane);
      load_row(gi, dout + at, d.HS, lane);
      load_row(oi, out + at, d.HS, lane);
      const A p = round_to_storage<S>(dev_exp(dot(qi, kj) * scale - L[i]));
      const A ds = p * (dot(gi, vj) - dot(gi, oi)) * scale;
#pragma unroll
      for (int r = 0; r < kMaxPer; ++r) dva[r] += p * gi[r], dka[r] += ds * qi[r];
    }
  }
#pragma unroll
  for (int r = 0; r < kMaxPer; ++r)
    if (lane + 32 * r < d.HS) dk[kat + lane + 32 * r] += dka[r], dv[kat + lane + 32 * r] += dva[r];
}

Dims dims(const Tensor& q, const Tensor& k, int n_head, int n_kv_head) {
  return Dims{q.dim(0), q.dim(1), k.dim(1), n_head, n_kv_head, int(q.dim(2) / n_head)};
}

int warp_grid(int64_t rows) { return int((rows + kWarps - 1) / kWarps); }

}  // namespace

void attention_block_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             int n_head, int n_kv_head, bool causal) {
  const Dims d = dims(q, k, n_head, n_kv_head);
  MT_CHECK(d.HS <= 32 * kMaxPer, "attention_block_forward on the GPU: head size {} above {}", d.HS, 32 * kMaxPer);
  const int64_t rows = d.B * d.NH * d.Tq;
  if (rows == 0) return;
  dispatch_dtype(q.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = acc_t<S>;
    block_forward_kernel<S><<<warp_grid(rows), 32 * kWarps, 0, compute_stream()>>>(
        ptr<A>(out), ptr<A>(lse), ptr<S>(q), ptr<S>(k), ptr<S>(v), d, causal);
    CUDA_LAUNCH_CHECK();
  });
}

void attention_block_merge(const Tensor& out, const Tensor& lse, const Tensor& out_b, const Tensor& lse_b,
                           int n_head) {
  const int64_t B = out.dim(0), Tq = out.dim(1), n = B * Tq * n_head;
  const int HS = int(out.dim(2) / n_head);
  if (n == 0) return;
  constexpr int kThreads = 256;
  if (out.dtype() == DType::F64)
    block_merge_kernel<double><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(
        ptr<double>(out), ptr<double>(lse), ptr<double>(out_b), ptr<double>(lse_b), B, Tq, n_head, HS);
  else
    block_merge_kernel<float><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(
        ptr<float>(out), ptr<float>(lse), ptr<float>(out_b), ptr<float>(lse_b), B, Tq, n_head, HS);
  CUDA_LAUNCH_CHECK();
}

void attention_block_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                              const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                              int n_head, int n_kv_head, bool causal) {
  const Dims d = dims(q, k, n_head, n_kv_head);
  MT_CHECK(d.HS <= 32 * kMaxPer, "attention_block_backward on the GPU: head size {} above {}", d.HS, 32 * kMaxPer);
  if (d.B * d.NH * d.Tq == 0) return;
  dispatch_dtype(q.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = acc_t<S>;
    block_backward_dq_kernel<S><<<warp_grid(d.B * d.NH * d.Tq), 32 * kWarps, 0, compute_stream()>>>(
        ptr<A>(dq), ptr<S>(dout), ptr<S>(out), ptr<A>(lse), ptr<S>(q), ptr<S>(k), ptr<S>(v), d, causal);
    CUDA_LAUNCH_CHECK();
    block_backward_dkdv_kernel<S><<<warp_grid(d.B * d.KV * d.Tk), 32 * kWarps, 0, compute_stream()>>>(
        ptr<A>(dk), ptr<A>(dv), ptr<S>(dout), ptr<S>(out), ptr<A>(lse), ptr<S>(q), ptr<S>(k), ptr<S>(v), d, causal);
    CUDA_LAUNCH_CHECK();
  });
}

}  // namespace mt::kernels::gpu
