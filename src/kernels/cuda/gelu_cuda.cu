// GPU GELU forward and backward (kernels/gelu.h): a grid-stride loop over 16-byte packs when every pointer is
// 16-byte aligned (then a scalar tail of fewer than one pack), else element by element. Each element is computed
// in fp32 (fp64 for fp64) with the CPU's formula (0.5 (1 + tanh u) as sigmoid(2u), which does not cancel for
// u << 0) and rounded once; expf is CUDA's (within 2 ulp), the CPU's is Eigen's, so fp32 results agree to a few
// ulp, not bitwise.
#include "kernels/cuda/gelu_cuda.h"

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mt::kernels::gpu {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kCubic = 0.044715;
constexpr int kThreads = 256;

__device__ __forceinline__ float exp_acc(float x) { return expf(x); }
__device__ __forceinline__ double exp_acc(double x) { return exp(x); }

// sigmoid(2u) = 0.5 (1 + tanh u), u = k (x + c x^3).
template <typename A>
__device__ __forceinline__ A sigmoid_2u(A x) {
  return A(1) / (A(1) + exp_acc(A(-2 * kSqrt2OverPi) * (x + A(kCubic) * x * x * x)));
}

template <typename A>
__device__ __forceinline__ A gelu(A x) {
  return x * sigmoid_2u(x);
}

// d/dx [x s] = s + 2 x s (1 - s) u'(x), s = sigmoid(2u), u' = k (1 + 3 c x^2); times dy.
template <typename A>
__device__ __forceinline__ A gelu_grad(A x, A dy) {
  const A s = sigmoid_2u(x);
  return dy * s * (A(1) + A(2) * x * (A(1) - s) * (A(kSqrt2OverPi) * (A(1) + A(3 * kCubic) * x * x)));
}

// V = Pack<S>::kN (all pointers 16-byte aligned) or 1.
template <typename S, int V>
__global__ void gelu_forward_kernel(S* out, const S* inp, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / V;
  for (int64_t p = first; p < packs; p += stride) {
    if constexpr (V == 1) {
      out[p] = from_acc<S>(gelu(to_acc(inp[p])));
    } else {
      const Pack<S> x = reinterpret_cast<const Pack<S>*>(inp)[p];
      Pack<S> y;
#pragma unroll
      for (int i = 0; i < V; ++i) y.v[i] = from_acc<S>(gelu(to_acc(x.v[i])));
      reinterpret_cast<Pack<S>*>(out)[p] = y;
    }
  }
  for (int64_t i = packs * V + first; i < n; i += stride) out[i] = from_acc<S>(gelu(to_acc(inp[i])));
}

// dinp may alias dout: each element is read and then written by the same thread (no __restrict__).
template <typename S, int V>
__global__ void gelu_backward_kernel(S* dinp, const S* inp, const S* dout, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / V;
  for (int64_t p = first; p < packs; p += stride) {
    if constexpr (V == 1) {
      dinp[p] = from_acc<S>(gelu_grad(to_acc(inp[p]), to_acc(dout[p])));
    } else {
      const Pack<S> x = reinterpret_cast<const Pack<S>*>(inp)[p];
      const Pack<S> dy = reinterpret_cast<const Pack<S>*>(dout)[p];
      Pack<S> dx;
#pragma unroll
      for (int i = 0; i < V; ++i) dx.v[i] = from_acc<S>(gelu_grad(to_acc(x.v[i]), to_acc(dy.v[i])));
      reinterpret_cast<Pack<S>*>(dinp)[p] = dx;
    }
  }
  for (int64_t i = packs * V + first; i < n; i += stride)
    dinp[i] = from_acc<S>(gelu_grad(to_acc(inp[i]), to_acc(dout[i])));
}

}  // namespace

void gelu_forward(const Tensor& out, const Tensor& inp) {
  const int64_t n = inp.numel();
  if (n == 0) return;
  dispatch_dtype(inp.dtype(), [&](auto s) {
    using S = decltype(s);
    constexpr int kPack = Pack<S>::kN;
    if (aligned16(out.data()) && aligned16(inp.data()))
      gelu_forward_kernel<S, kPack><<<grid_for(n / kPack, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<S>(out), ptr<S>(inp), n);
    else
      gelu_forward_kernel<S, 1><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(ptr<S>(out), ptr<S>(inp),
                                                                                          n);
    CUDA_LAUNCH_CHECK();
  });
}

void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  const int64_t n = inp.numel();
  if (n == 0) return;
  dispatch_dtype(inp.dtype(), [&](auto s) {
    using S = decltype(s);
    constexpr int kPack = Pack<S>::kN;
    if (aligned16(dinp.data()) && aligned16(inp.data()) && aligned16(dout.data()))
      gelu_backward_kernel<S, kPack><<<grid_for(n / kPack, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<S>(dinp), ptr<S>(inp), ptr<S>(dout), n);
    else
      gelu_backward_kernel<S, 1><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<S>(dinp), ptr<S>(inp), ptr<S>(dout), n);
    CUDA_LAUNCH_CHECK();
  });
}

}  // namespace mt::kernels::gpu
