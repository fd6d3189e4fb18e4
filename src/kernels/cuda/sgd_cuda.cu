// GPU SGD with momentum, and local SGD's outer Nesterov step: the CPU loops' arithmetic (kernels/sgd.cpp) element
// by element, scalars rounded to the parameter type on the host as there, grad_scale[0] read from device memory.
// SGD's fp32 params and grads use float4 loads/stores when all three buffers are 16-byte aligned (then a scalar
// tail).
#include "kernels/cuda/sgd_cuda.h"

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace mt::kernels::gpu {
namespace {

constexpr int kThreads = 256;

template <typename P>
struct SGDConsts {
  P decay, lr, momentum;
};

template <typename P, typename G>
__device__ __forceinline__ void sgd_element(P& param, G grad, P& buf, P scale, const SGDConsts<P>& k) {
  const P g = P(grad) * scale;
  buf = k.momentum * buf + g;
  param = param * k.decay - k.lr * buf;
}

template <typename P, typename G, bool kVector>
__global__ void sgd_kernel(P* __restrict__ params, const G* __restrict__ grads, P* __restrict__ buf,
                           const void* grad_scale, bool grad_scale_f64, int64_t n, SGDConsts<P> k) {
  const P scale = grad_scale_f64 ? P(*static_cast<const double*>(grad_scale))
                                 : P(*static_cast<const float*>(grad_scale));
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (kVector) {
    static_assert(std::is_same_v<P, float> && std::is_same_v<G, float>, "float4 path is fp32 only");
    const int64_t packs = n / 4;
    for (int64_t q = first; q < packs; q += stride) {
      float4 p4 = reinterpret_cast<float4*>(params)[q], b4 = reinterpret_cast<float4*>(buf)[q];
      const float4 g4 = reinterpret_cast<const float4*>(grads)[q];
      sgd_element(p4.x, g4.x, b4.x, scale, k);
      sgd_element(p4.y, g4.y, b4.y, scale, k);
      sgd_element(p4.z, g4.z, b4.z, scale, k);
      sgd_element(p4.w, g4.w, b4.w, scale, k);
      reinterpret_cast<float4*>(params)[q] = p4, reinterpret_cast<float4*>(buf)[q] = b4;
    }
    done = packs * 4;
  }
  for (int64_t i = done + first; i < n; i += stride) sgd_element(params[i], grads[i], buf[i], scale, k);
}

template <typename P, typename G>
void launch(const Tensor& params, const Tensor& grads, const Tensor& buf, const Tensor& grad_scale,
            const SGDHyper& h) {
  const int64_t n = params.numel();
  if (n == 0) return;
  const SGDConsts<P> k{P(1.0 - h.lr * h.weight_decay), P(h.lr), P(h.momentum)};
  const bool scale_f64 = grad_scale.dtype() == DType::F64;
  if constexpr (std::is_same_v<P, float> && std::is_same_v<G, float>) {
    if (aligned16(params.data()) && aligned16(grads.data()) && aligned16(buf.data())) {
      sgd_kernel<P, G, true><<<grid_for(n / 4, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<P>(params), ptr<G>(grads), ptr<P>(buf), grad_scale.data(), scale_f64, n, k);
      CUDA_LAUNCH_CHECK();
      return;
    }
  }
  sgd_kernel<P, G, false><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(
      ptr<P>(params), ptr<G>(grads), ptr<P>(buf), grad_scale.data(), scale_f64, n, k);
  CUDA_LAUNCH_CHECK();
}

template <typename P>
__global__ void outer_nesterov_kernel(P* __restrict__ a, P* __restrict__ v, P* __restrict__ x, P lr, P mu,
                                      int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const P d = a[i] - x[i];
    const P vi = mu * v[i] + d;
    const P ai = a[i] - lr * (d + mu * vi);
    v[i] = vi, a[i] = ai, x[i] = ai;
  }
}

template <typename P>
void launch_outer_nesterov(const Tensor& anchor, const Tensor& velocity, const Tensor& x, double lr, double mu) {
  const int64_t n = anchor.numel();
  if (n == 0) return;
  outer_nesterov_kernel<P><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(
      ptr<P>(anchor), ptr<P>(velocity), ptr<P>(x), P(lr), P(mu), n);
  CUDA_LAUNCH_CHECK();
}

}  // namespace

void outer_nesterov_update(const Tensor& anchor, const Tensor& velocity, const Tensor& x, double lr, double momentum) {
  if (anchor.dtype() == DType::F64) launch_outer_nesterov<double>(anchor, velocity, x, lr, momentum);
  else launch_outer_nesterov<float>(anchor, velocity, x, lr, momentum);
}

void sgd_update(const Tensor& params, const Tensor& grads, const Tensor& buf, const Tensor& grad_scale,
                const SGDHyper& h) {
  if (params.dtype() == DType::F64) launch<double, double>(params, grads, buf, grad_scale, h);
  else if (grads.dtype() == DType::F32) launch<float, float>(params, grads, buf, grad_scale, h);
  else launch<float, double>(params, grads, buf, grad_scale, h);
}

}  // namespace mt::kernels::gpu
