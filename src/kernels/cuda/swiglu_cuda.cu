// GPU SwiGLU forward and backward (kernels/swiglu.h): a grid-stride loop over the [N, H] output positions, in
// 16-byte packs when H is a multiple of the pack and every pointer is 16-byte aligned (a pack then never crosses a
// row), else element by element. Each element is computed in fp32 (fp64 for fp64) with the CPU's formula and
// rounded once; expf is CUDA's (within 2 ulp) where the CPU uses Eigen's, so fp32 results agree to a few ulp.
#include "kernels/cuda/swiglu_cuda.h"

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mt::kernels::gpu {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float exp_acc(float x) { return expf(x); }
__device__ __forceinline__ double exp_acc(double x) { return exp(x); }

template <typename A>
__device__ __forceinline__ A sigmoid(A x) {
  return A(1) / (A(1) + exp_acc(-x));
}

// V = Pack<S>::kN (H a multiple of it, all pointers 16-byte aligned) or 1. p indexes packs of the [N, H] output.
template <typename S, int V>
__global__ void swiglu_forward_kernel(S* out, const S* inp, int64_t N, int64_t H) {
  using A = acc_t<S>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, packs = N * H / V;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    const int64_t n = p * V / H, c = p * V % H;
    A g[V], u[V], y[V];
    load_n<V>(g, inp + n * 2 * H + c), load_n<V>(u, inp + n * 2 * H + H + c);
#pragma unroll
    for (int i = 0; i < V; ++i) y[i] = g[i] / (A(1) + exp_acc(-g[i])) * u[i];
    store_n<V>(out + p * V, y);
  }
}

// d silu / dg = s (1 + g (1 - s)) with s = sigmoid(g), as the CPU.
template <typename S, int V>
__global__ void swiglu_backward_kernel(S* dinp, const S* dout, const S* inp, int64_t N, int64_t H) {
  using A = acc_t<S>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, packs = N * H / V;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    const int64_t n = p * V / H, c = p * V % H;
    A g[V], u[V], dy[V], dg[V], du[V];
    load_n<V>(g, inp + n * 2 * H + c), load_n<V>(u, inp + n * 2 * H + H + c), load_n<V>(dy, dout + p * V);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const A s = sigmoid(g[i]);
      du[i] = dy[i] * g[i] * s;
      dg[i] = dy[i] * u[i] * s * (A(1) + g[i] * (A(1) - s));
    }
    store_n<V>(dinp + n * 2 * H + c, dg), store_n<V>(dinp + n * 2 * H + H + c, du);
  }
}

}  // namespace

void swiglu_forward(const Tensor& out, const Tensor& inp) {
  const int64_t H = inp.dim(-1) / 2, N = H > 0 ? inp.numel() / (2 * H) : 0;
  if (N * H == 0) return;
  dispatch_dtype(inp.dtype(), [&](auto s) {
    using S = decltype(s);
    constexpr int kPack = Pack<S>::kN;
    if (H % kPack == 0 && aligned16(out.data()) && aligned16(inp.data()))
      swiglu_forward_kernel<S, kPack><<<grid_for(N * H / kPack, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<S>(out), ptr<S>(inp), N, H);
    else
      swiglu_forward_kernel<S, 1><<<grid_for(N * H, kThreads), kThreads, 0, compute_stream()>>>(ptr<S>(out),
                                                                                              ptr<S>(inp), N, H);
    CUDA_LAUNCH_CHECK();
  });
}

void swiglu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  const int64_t H = inp.dim(-1) / 2, N = H > 0 ? inp.numel() / (2 * H) : 0;
  if (N * H == 0) return;
  dispatch_dtype(inp.dtype(), [&](auto s) {
    using S = decltype(s);
    constexpr int kPack = Pack<S>::kN;
    if (H % kPack == 0 && aligned16(dinp.data()) && aligned16(dout.data()) && aligned16(inp.data()))
      swiglu_backward_kernel<S, kPack><<<grid_for(N * H / kPack, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<S>(dinp), ptr<S>(dout), ptr<S>(inp), N, H);
    else
      swiglu_backward_kernel<S, 1><<<grid_for(N * H, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<S>(dinp), ptr<S>(dout), ptr<S>(inp), N, H);
    CUDA_LAUNCH_CHECK();
  });
}

}  // namespace mt::kernels::gpu
