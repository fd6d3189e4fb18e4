// GPU SwiGLU forward and backward (kernels/swiglu.h): elementwise grid-stride loops over 16-byte packs when every
// pointer is 16-byte aligned (then a scalar tail of fewer than one pack), else element by element. Each element is
// computed in fp32 (fp64 for fp64) with the CPU's formula and rounded once; expf is CUDA's (within 2 ulp) where
// the CPU uses Eigen's, so fp32 results agree to a few ulp.
// An output may alias an input (the same pointer): each thread loads all of its elements' inputs before it stores
// their outputs, and no other thread touches those elements; hence no __restrict__.
#include "kernels/cuda/swiglu_cuda.h"

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mt::kernels::gpu {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float exp_acc(float x) { return expf(x); }
__device__ __forceinline__ double exp_acc(double x) { return exp(x); }

// The V elements at i: out = silu(gate) * up.
template <int V, typename S>
__device__ __forceinline__ void forward_at(S* out, const S* gate, const S* up, int64_t i) {
  using A = acc_t<S>;
  A g[V], u[V], y[V];
  load_n<V>(g, gate + i), load_n<V>(u, up + i);
#pragma unroll
  for (int k = 0; k < V; ++k) y[k] = g[k] / (A(1) + exp_acc(-g[k])) * u[k];
  store_n<V>(out + i, y);
}

// The V elements at i: d silu / dg = s (1 + g (1 - s)) with s = sigmoid(g), as the CPU.
template <int V, typename S>
__device__ __forceinline__ void backward_at(S* dgate, S* dup, const S* dout, const S* gate, const S* up, int64_t i) {
  using A = acc_t<S>;
  A g[V], u[V], dy[V], dg[V], du[V];
  load_n<V>(g, gate + i), load_n<V>(u, up + i), load_n<V>(dy, dout + i);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const A s = A(1) / (A(1) + exp_acc(-g[k]));
    du[k] = dy[k] * g[k] * s;
    dg[k] = dy[k] * u[k] * s * (A(1) + g[k] * (A(1) - s));
  }
  store_n<V>(dgate + i, dg), store_n<V>(dup + i, du);
}

// V = Pack<S>::kN (all pointers 16-byte aligned) or 1.
template <typename S, int V>
__global__ void swiglu_forward_kernel(S* out, const S* gate, const S* up, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / V;
  for (int64_t p = first; p < packs; p += stride) forward_at<V>(out, gate, up, p * V);
  for (int64_t i = packs * V + first; i < n; i += stride) forward_at<1>(out, gate, up, i);
}

template <typename S, int V>
__global__ void swiglu_backward_kernel(S* dgate, S* dup, const S* dout, const S* gate, const S* up, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / V;
  for (int64_t p = first; p < packs; p += stride) backward_at<V>(dgate, dup, dout, gate, up, p * V);
  for (int64_t i = packs * V + first; i < n; i += stride) backward_at<1>(dgate, dup, dout, gate, up, i);
}

}  // namespace

void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  dispatch_dtype(gate.dtype(), [&](auto s) {
    using S = decltype(s);
    constexpr int kPack = Pack<S>::kN;
    if (aligned16(out.data()) && aligned16(gate.data()) && aligned16(up.data()))
      swiglu_forward_kernel<S, kPack><<<grid_for(n / kPack, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<S>(out), ptr<S>(gate), ptr<S>(up), n);
    else
      swiglu_forward_kernel<S, 1><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<S>(out), ptr<S>(gate), ptr<S>(up), n);
    CUDA_LAUNCH_CHECK();
  });
}

void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate, const Tensor& up) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  dispatch_dtype(gate.dtype(), [&](auto s) {
    using S = decltype(s);
    constexpr int kPack = Pack<S>::kN;
    if (aligned16(dgate.data()) && aligned16(dup.data()) && aligned16(dout.data()) && aligned16(gate.data()) &&
        aligned16(up.data()))
      swiglu_backward_kernel<S, kPack><<<grid_for(n / kPack, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<S>(dgate), ptr<S>(dup), ptr<S>(dout), ptr<S>(gate), ptr<S>(up), n);
    else
      swiglu_backward_kernel<S, 1><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<S>(dgate), ptr<S>(dup), ptr<S>(dout), ptr<S>(gate), ptr<S>(up), n);
    CUDA_LAUNCH_CHECK();
  });
}

}  // namespace mt::kernels::gpu
