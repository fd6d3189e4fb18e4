// GPU AdamW: the CPU kernel's arithmetic (kernels/cpu/adamw_cpu.cpp, PyTorch's single-tensor order) element by
// element, with the same scalars rounded to the parameter type on the host (kernels/adamw_consts.h), and
// grad_scale[0] read by each thread from device memory (it is written by clip_scale on the device). fp32 params and grads go through float4
// loads/stores when all four buffers are 16-byte aligned (then a scalar tail); other combinations element by
// element. IEEE sqrt and division (no fast math); results differ from the CPU only where either compiler
// contracts a multiply-add into an FMA.
#include "kernels/cuda/adamw_cuda.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/adamw_consts.h"
#include "kernels/cuda/common.cuh"

namespace mt::kernels::gpu {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sqrt_p(float x) { return sqrtf(x); }
__device__ __forceinline__ double sqrt_p(double x) { return sqrt(x); }

template <typename P, typename G>
__device__ __forceinline__ void adamw_element(P& param, G grad, P& m, P& v, P gs, const AdamWConsts<P>& k) {
  const P g = P(grad) * gs;
  const P p = param * k.decay;
  const P mi = m * k.b1 + g * k.one_minus_b1;
  const P vi = v * k.b2 + g * g * k.one_minus_b2;
  const P denom = sqrt_p(vi) / k.bc2_sqrt + k.eps;
  param = p + k.neg_step * (mi / denom);
  m = mi;
  v = vi;
}

// kVector: P == G == float, every pointer 16-byte aligned.
template <typename P, typename G, bool kVector>
__global__ void adamw_kernel(P* __restrict__ params, const G* __restrict__ grads, P* __restrict__ m,
                             P* __restrict__ v, const void* grad_scale, bool grad_scale_f64, int64_t n,
                             AdamWConsts<P> k) {
  const P gs = grad_scale_f64 ? P(*static_cast<const double*>(grad_scale))
                              : P(*static_cast<const float*>(grad_scale));
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (kVector) {
    static_assert(std::is_same_v<P, float> && std::is_same_v<G, float>, "float4 path is fp32 only");
    const int64_t packs = n / 4;
    for (int64_t q = first; q < packs; q += stride) {
      float4 p4 = reinterpret_cast<float4*>(params)[q], m4 = reinterpret_cast<float4*>(m)[q];
      float4 v4 = reinterpret_cast<float4*>(v)[q];
      const float4 g4 = reinterpret_cast<const float4*>(grads)[q];
      adamw_element(p4.x, g4.x, m4.x, v4.x, gs, k);
      adamw_element(p4.y, g4.y, m4.y, v4.y, gs, k);
      adamw_element(p4.z, g4.z, m4.z, v4.z, gs, k);
      adamw_element(p4.w, g4.w, m4.w, v4.w, gs, k);
      reinterpret_cast<float4*>(params)[q] = p4, reinterpret_cast<float4*>(m)[q] = m4;
      reinterpret_cast<float4*>(v)[q] = v4;
    }
    done = packs * 4;
  }
  for (int64_t i = done + first; i < n; i += stride) adamw_element(params[i], grads[i], m[i], v[i], gs, k);
}

template <typename P, typename G>
void launch(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v, const Tensor& grad_scale,
            const AdamWHyper& h) {
  const int64_t n = params.numel();
  if (n == 0) return;
  const AdamWConsts<P> k = adamw_consts<P>(h);  // the CPU's scalars, bit for bit
  const bool scale_f64 = grad_scale.dtype() == DType::F64;
  if constexpr (std::is_same_v<P, float> && std::is_same_v<G, float>) {
    bool vec = true;
    for (const Tensor* x : {&params, &grads, &m, &v}) vec = vec && aligned16(x->data());
    if (vec) {
      adamw_kernel<P, G, true><<<grid_for(n / 4, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<P>(params), ptr<G>(grads), ptr<P>(m), ptr<P>(v), grad_scale.data(), scale_f64, n, k);
      CUDA_LAUNCH_CHECK();
      return;
    }
  }
  adamw_kernel<P, G, false><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(
      ptr<P>(params), ptr<G>(grads), ptr<P>(m), ptr<P>(v), grad_scale.data(), scale_f64, n, k);
  CUDA_LAUNCH_CHECK();
}

}  // namespace

void adamw_update(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                  const Tensor& grad_scale, const AdamWHyper& h) {
  if (params.dtype() == DType::F64) launch<double, double>(params, grads, m, v, grad_scale, h);
  else if (grads.dtype() == DType::F32) launch<float, float>(params, grads, m, v, grad_scale, h);
  else launch<float, double>(params, grads, m, v, grad_scale, h);
}

}  // namespace mt::kernels::gpu
