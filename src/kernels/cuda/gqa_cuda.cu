// GPU grouped-query attention expansion and reduction (kernels/gqa.h): grid-stride loops over the output's
// elements, in 16-byte packs when head_size is a multiple of the pack and every pointer is 16-byte aligned (a pack
// then never crosses a head, and every row of q, k, v and the full tensor starts aligned), else element by element.
// The expansion copies bits; the reduction sums each group's elements in fp32 (fp64 for fp64) in query-head order,
// as the CPU, and rounds once, so it matches the CPU exactly.
#include "kernels/cuda/gqa_cuda.h"

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mt::kernels::gpu {
namespace {

constexpr int kThreads = 256;

template <int V, typename S>
__device__ __forceinline__ void copy_n(S* dst, const S* src) {
  if constexpr (V == 1)
    *dst = *src;
  else
    *reinterpret_cast<Pack<S>*>(dst) = *reinterpret_cast<const Pack<S>*>(src);
}

// Head dimensions of one row, in elements: QW = NH HS (q, and each part of the full row), KW = KV HS (k, v).
struct Dims {
  int64_t N, HS, QW, KW;
  int group;  // NH / KV
};

// qkv_full [N, 3 QW] from q [N, QW], k and v [N, KW]; p indexes packs of the output.
template <typename S, int V>
__global__ void gqa_expand_kernel(S* full, const S* q, const S* k, const S* v, Dims d) {
  const int64_t WF = 3 * d.QW, packs = d.N * WF / V;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    const int64_t n = p * V / WF, col = p * V % WF, part = col / d.QW;
    const S* src = q + n * d.QW + col;  // q: the same column
    if (part > 0) {
      const int64_t within = col - part * d.QW, h = within / d.HS;
      src = (part == 1 ? k : v) + n * d.KW + (h / d.group) * d.HS + within % d.HS;
    }
    copy_n<V>(full + p * V, src);
  }
}

// dq [N, QW], dk and dv [N, KW] from dqkv_full [N, 3 QW]; p indexes packs of a row dq | dk | dv of QW + 2 KW
// elements (each pack within one of the three, as KW and QW are multiples of HS).
template <typename S, int V>
__global__ void gqa_reduce_kernel(S* dq, S* dk, S* dv, const S* full, Dims d) {
  using A = acc_t<S>;
  const int64_t WF = 3 * d.QW, W = d.QW + 2 * d.KW, packs = d.N * W / V;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    const int64_t n = p * V / W, col = p * V % W;
    const S* row = full + n * WF;
    if (col < d.QW) {
      copy_n<V>(dq + n * d.QW + col, row + col);
      continue;
    }
    const int64_t part = (col - d.QW) / d.KW, within = (col - d.QW) % d.KW;
    const S* heads = row + (1 + part) * d.QW + (within / d.HS) * d.group * d.HS + within % d.HS;
    A s[V] = {};
    for (int r = 0; r < d.group; ++r) {
      A x[V];
      load_n<V>(x, heads + r * d.HS);
#pragma unroll
      for (int i = 0; i < V; ++i) s[i] += x[i];
    }
    store_n<V>((part == 0 ? dk : dv) + n * d.KW + within, s);
  }
}

Dims dims(const Tensor& q, int n_head, int n_kv_head, int head_size) {
  const int64_t HS = head_size, QW = int64_t(n_head) * HS, KW = int64_t(n_kv_head) * HS;
  return Dims{q.numel() / QW, HS, QW, KW, n_head / n_kv_head};
}

}  // namespace

void gqa_expand(const Tensor& qkv_full, const Tensor& q, const Tensor& k, const Tensor& v, int n_head, int n_kv_head,
                int head_size) {
  const Dims d = dims(q, n_head, n_kv_head, head_size);
  const int64_t n = d.N * 3 * d.QW;
  if (n == 0) return;
  dispatch_dtype(q.dtype(), [&](auto s) {
    using S = decltype(s);
    constexpr int kPack = Pack<S>::kN;
    if (d.HS % kPack == 0 && aligned16(qkv_full.data()) && aligned16(q.data()) && aligned16(k.data()) &&
        aligned16(v.data()))
      gqa_expand_kernel<S, kPack><<<grid_for(n / kPack, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<S>(qkv_full), ptr<S>(q), ptr<S>(k), ptr<S>(v), d);
    else
      gqa_expand_kernel<S, 1><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<S>(qkv_full), ptr<S>(q), ptr<S>(k), ptr<S>(v), d);
    CUDA_LAUNCH_CHECK();
  });
}

void gqa_reduce(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dqkv_full, int n_head,
                int n_kv_head, int head_size) {
  const Dims d = dims(dq, n_head, n_kv_head, head_size);
  const int64_t n = d.N * (d.QW + 2 * d.KW);
  if (n == 0) return;
  dispatch_dtype(dq.dtype(), [&](auto s) {
    using S = decltype(s);
    constexpr int kPack = Pack<S>::kN;
    if (d.HS % kPack == 0 && aligned16(dq.data()) && aligned16(dk.data()) && aligned16(dv.data()) &&
        aligned16(dqkv_full.data()))
      gqa_reduce_kernel<S, kPack><<<grid_for(n / kPack, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<S>(dq), ptr<S>(dk), ptr<S>(dv), ptr<S>(dqkv_full), d);
    else
      gqa_reduce_kernel<S, 1><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<S>(dq), ptr<S>(dk), ptr<S>(dv), ptr<S>(dqkv_full), d);
    CUDA_LAUNCH_CHECK();
  });
}

}  // namespace mt::kernels::gpu
