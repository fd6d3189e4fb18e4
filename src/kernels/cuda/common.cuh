// Shared by the CUDA kernels (src/kernels/cuda/*.cu): element types, fp32 conversions, dtype dispatch and
// launch sizes. Every kernel runs on compute_stream() and is followed by CUDA_LAUNCH_CHECK().
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/cuda_context.h"
#include "core/cuda_check.h"
#include "core/tensor.h"

namespace mt::kernels::gpu {

using bf16 = __nv_bfloat16;
using fp16 = __half;

// Load any storage type as its accumulation type (fp32, or fp64 for double) and round back once.
__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_acc(fp16 x) { return __half2float(x); }
template <typename S> __device__ __forceinline__ S from_acc(float x);
template <> __device__ __forceinline__ float from_acc<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_acc<bf16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ fp16 from_acc<fp16>(float x) { return __float2half_rn(x); }
template <typename S> __device__ __forceinline__ S from_acc(double x) { return from_acc<S>(static_cast<float>(x)); }
template <> __device__ __forceinline__ double from_acc<double>(double x) { return x; }
template <> __device__ __forceinline__ double from_acc<double>(float x) { return x; }

// The accumulation type of a storage type: double for double, else float (core/dtype.h's acc_dtype).
template <typename S> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };
template <typename S> using acc_t = typename Acc<S>::type;

// Calls f(S{}) with the device storage type of t (float, double, bf16, fp16).
template <typename F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::F64: return f(double{});
    case DType::BF16: return f(bf16{});
    case DType::F16: return f(fp16{});
    default: return f(float{});
  }
}

template <typename S> S* ptr(const Tensor& t) { return static_cast<S*>(t.data()); }

// Blocks for a grid-stride loop over n elements (capped: each thread takes several).
inline int grid_for(int64_t n, int threads, int max_blocks = 65535) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, max_blocks)));
}

// The device's multiprocessor count, for grids sized to fill the chip.
inline int sm_count() {
  int dev = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

// 16 bytes of S: the unit of the vectorised loads and stores.
template <typename S>
struct alignas(16) Pack {
  static constexpr int kN = 16 / int(sizeof(S));
  S v[kN];
};

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// V consecutive elements at p widened to A: one 16-byte load when V > 1 (p then 16-byte aligned).
template <int V, typename S, typename A>
__device__ __forceinline__ void load_n(A (&x)[V], const S* p) {
  if constexpr (V == 1) {
    x[0] = to_acc(p[0]);
  } else {
    static_assert(V == Pack<S>::kN, "a vector access is one 16-byte pack");
    const Pack<S> pk = *reinterpret_cast<const Pack<S>*>(p);
#pragma unroll
    for (int i = 0; i < V; ++i) x[i] = to_acc(pk.v[i]);
  }
}

// V consecutive elements at p, each rounded once from A to S.
template <int V, typename S, typename A>
__device__ __forceinline__ void store_n(S* p, const A (&x)[V]) {
  if constexpr (V == 1) {
    p[0] = from_acc<S>(x[0]);
  } else {
    static_assert(V == Pack<S>::kN, "a vector access is one 16-byte pack");
    Pack<S> pk;
#pragma unroll
    for (int i = 0; i < V; ++i) pk.v[i] = from_acc<S>(x[i]);
    *reinterpret_cast<Pack<S>*>(p) = pk;
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace mt::kernels::gpu
