// GPU reductions in double, with no host synchronisation. Two kernels on the compute stream: up to kMaxPartials
// blocks each sum a grid-stride share of x in double (16-byte packs when aligned) and write their block's sum to
// a device-global partials array; then one warp adds the partials in a fixed order and adds the total to acc
// (fp32 or fp64) as the CPU does: acc = A(double(acc) + total). No atomics, so for a given n the result is bitwise
// reproducible (it differs from the CPU's by the summation order only).
// The partials array is shared by every call in the process: safe because both kernels of a call, and the calls
// themselves, run in order on the one compute stream. clip_scale is a single device thread reading norm_sq.
#include "kernels/cuda/reduce_cuda.h"

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mt::kernels::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxPartials = 1024;
__device__ double g_partials[kMaxPartials];

template <bool kSquare>
__device__ __forceinline__ double term(double v) {
  return kSquare ? v * v : v;
}

// g_partials[blockIdx.x] = this block's share of sum(x) (or of sum(x * x)), in double. blockDim.x == kThreads.
template <typename S, int V, bool kSquare>
__global__ void partial_sums_kernel(const S* x, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / V;
  double s = 0;
  for (int64_t p = first; p < packs; p += stride) {
    if constexpr (V == 1) {
      s += term<kSquare>(double(to_acc(x[p])));
    } else {
      const Pack<S> v = reinterpret_cast<const Pack<S>*>(x)[p];
#pragma unroll
      for (int i = 0; i < V; ++i) s += term<kSquare>(double(to_acc(v.v[i])));
    }
  }
  for (int64_t i = packs * V + first; i < n; i += stride) s += term<kSquare>(double(to_acc(x[i])));

  __shared__ double warp_sums[kThreads / 32];
  s = warp_sum(s);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    s = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.0;
    s = warp_sum(s);
    if (threadIdx.x == 0) g_partials[blockIdx.x] = s;
  }
}

// One warp: acc[0] = A(double(acc[0]) + sum of the first `parts` partials), summed in a fixed order.
template <typename A>
__global__ void add_partials_kernel(A* acc, int parts) {
  double s = 0;
  for (int i = threadIdx.x; i < parts; i += 32) s += g_partials[i];
  s = warp_sum(s);
  if (threadIdx.x == 0) acc[0] = A(double(acc[0]) + s);
}

template <bool kSquare>
void accumulate_reduction(const Tensor& acc, const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return;  // acc + 0 == acc
  int parts = 0;
  dispatch_dtype(x.dtype(), [&](auto t) {
    using S = decltype(t);
    constexpr int kPack = Pack<S>::kN;
    if (aligned16(x.data())) {
      parts = grid_for(n / kPack, kThreads, kMaxPartials);
      partial_sums_kernel<S, kPack, kSquare><<<parts, kThreads, 0, compute_stream()>>>(ptr<S>(x), n);
    } else {
      parts = grid_for(n, kThreads, kMaxPartials);
      partial_sums_kernel<S, 1, kSquare><<<parts, kThreads, 0, compute_stream()>>>(ptr<S>(x), n);
    }
    CUDA_LAUNCH_CHECK();
  });
  if (acc.dtype() == DType::F64)
    add_partials_kernel<double><<<1, 32, 0, compute_stream()>>>(ptr<double>(acc), parts);
  else
    add_partials_kernel<float><<<1, 32, 0, compute_stream()>>>(ptr<float>(acc), parts);
  CUDA_LAUNCH_CHECK();
}

__device__ __forceinline__ double load_scalar(const void* p, bool f64) {
  return f64 ? *static_cast<const double*>(p) : double(*static_cast<const float*>(p));
}
__device__ __forceinline__ void store_scalar(void* p, bool f64, double v) {
  if (f64) *static_cast<double*>(p) = v;
  else *static_cast<float*>(p) = float(v);
}

// The CPU's clip_scale (kernels/reduce.cpp), in double, on one thread.
__global__ void clip_scale_kernel(void* scale, bool scale_f64, void* norm, bool norm_f64, const void* norm_sq,
                                  bool norm_sq_f64, double max_norm, double inv_loss_scale) {
  const double n = sqrt(load_scalar(norm_sq, norm_sq_f64)) * inv_loss_scale;  // the unscaled gradients' norm
  double s = 1.0;  // torch clip_grad_norm_: clip_coef = max_norm / (norm + 1e-6), applied only when < 1
  if (max_norm > 0) {
    const double coef = max_norm / (n + 1e-6);
    if (coef < 1.0) s = coef;
  }
  store_scalar(norm, norm_f64, n);
  store_scalar(scale, scale_f64, s * inv_loss_scale);
}

}  // namespace

void sum_accumulate(const Tensor& acc, const Tensor& x) { accumulate_reduction<false>(acc, x); }

void sum_squares_accumulate(const Tensor& acc, const Tensor& x) { accumulate_reduction<true>(acc, x); }

void clip_scale(const Tensor& scale, const Tensor& norm, const Tensor& norm_sq, double max_norm,
                double inv_loss_scale) {
  clip_scale_kernel<<<1, 1, 0, compute_stream()>>>(scale.data(), scale.dtype() == DType::F64, norm.data(),
                                                   norm.dtype() == DType::F64, norm_sq.data(),
                                                   norm_sq.dtype() == DType::F64, max_norm, inv_loss_scale);
  CUDA_LAUNCH_CHECK();
}

}  // namespace mt::kernels::gpu
