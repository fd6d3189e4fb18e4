// GPU elementwise ops (kernels/elementwise.h): grid-stride loops over 16-byte packs when the dtypes match and
// every pointer is 16-byte aligned (then a scalar tail), else element by element. Each element is formed in the
// accumulation type (for accumulate: fp64 if either side is fp64, else fp32, as the CPU) and rounded once, so the
// results equal the CPU's bit for bit. Same-index reads and writes by one thread make out/dst aliasing safe.
#include "kernels/cuda/elementwise_cuda.h"

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace mt::kernels::gpu {
namespace {

constexpr int kThreads = 256;

template <typename S, int V>
__global__ void add_kernel(S* out, const S* a, const S* b, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / V;
  for (int64_t p = first; p < packs; p += stride) {
    if constexpr (V == 1) {
      out[p] = from_acc<S>(to_acc(a[p]) + to_acc(b[p]));
    } else {
      const Pack<S> x = reinterpret_cast<const Pack<S>*>(a)[p], y = reinterpret_cast<const Pack<S>*>(b)[p];
      Pack<S> z;
#pragma unroll
      for (int i = 0; i < V; ++i) z.v[i] = from_acc<S>(to_acc(x.v[i]) + to_acc(y.v[i]));
      reinterpret_cast<Pack<S>*>(out)[p] = z;
    }
  }
  for (int64_t i = packs * V + first; i < n; i += stride) out[i] = from_acc<S>(to_acc(a[i]) + to_acc(b[i]));
}

// dst += src: the sum in fp64 when either side is fp64, else fp32; rounded once to D (through fp32 for a 16-bit
// D and an fp64 src, as the CPU's store(acc_t<D>(...)) does).
template <typename D, typename S>
__device__ __forceinline__ D accumulated(D d, S s) {
  using A = std::conditional_t<std::is_same_v<D, double> || std::is_same_v<S, double>, double, float>;
  return from_acc<D>(acc_t<D>(A(to_acc(d)) + A(to_acc(s))));
}

// V > 1 only when D == S (one pack of each).
template <typename D, typename S, int V>
__global__ void accumulate_kernel(D* dst, const S* src, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / V;
  for (int64_t p = first; p < packs; p += stride) {
    if constexpr (V == 1) {
      dst[p] = accumulated(dst[p], src[p]);
    } else {
      static_assert(std::is_same_v<D, S>, "vector accumulate needs one dtype");
      Pack<D> d = reinterpret_cast<const Pack<D>*>(dst)[p];
      const Pack<S> s = reinterpret_cast<const Pack<S>*>(src)[p];
#pragma unroll
      for (int i = 0; i < V; ++i) d.v[i] = accumulated(d.v[i], s.v[i]);
      reinterpret_cast<Pack<D>*>(dst)[p] = d;
    }
  }
  for (int64_t i = packs * V + first; i < n; i += stride) dst[i] = accumulated(dst[i], src[i]);
}

// out[N, OC] += bias[OC]. V > 1 only when OC is a multiple of V, so a pack never straddles two rows.
template <typename S, int V>
__global__ void bias_add_kernel(S* out, const S* bias, int64_t n, int64_t OC) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t p = first; p < n / V; p += stride) {
    const int64_t c = (p * V) % OC;
    if constexpr (V == 1) {
      out[p] = from_acc<S>(to_acc(out[p]) + to_acc(bias[c]));
    } else {
      Pack<S> o = reinterpret_cast<const Pack<S>*>(out)[p];
      const Pack<S> b = *reinterpret_cast<const Pack<S>*>(bias + c);
#pragma unroll
      for (int i = 0; i < V; ++i) o.v[i] = from_acc<S>(to_acc(o.v[i]) + to_acc(b.v[i]));
      reinterpret_cast<Pack<S>*>(out)[p] = o;
    }
  }
}

template <typename S>
__global__ void divide_kernel(S* x, float d, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = from_acc<S>(float(to_acc(x[i])) / d);  // a true division, as the host's: x * (1 / d) rounds otherwise
}

}  // namespace

void add_forward(const Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t n = a.numel();
  if (n == 0) return;
  dispatch_dtype(a.dtype(), [&](auto s) {
    using S = decltype(s);
    constexpr int kPack = Pack<S>::kN;
    if (aligned16(out.data()) && aligned16(a.data()) && aligned16(b.data()))
      add_kernel<S, kPack><<<grid_for(n / kPack, kThreads), kThreads, 0, compute_stream()>>>(ptr<S>(out), ptr<S>(a),
                                                                                            ptr<S>(b), n);
    else
      add_kernel<S, 1><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(ptr<S>(out), ptr<S>(a), ptr<S>(b), n);
    CUDA_LAUNCH_CHECK();
  });
}

void accumulate(const Tensor& dst, const Tensor& src) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  dispatch_dtype(dst.dtype(), [&](auto d) {
    dispatch_dtype(src.dtype(), [&](auto s) {
      using D = decltype(d);
      using S = decltype(s);
      if constexpr (std::is_same_v<D, S>) {
        constexpr int kPack = Pack<S>::kN;
        if (aligned16(dst.data()) && aligned16(src.data())) {
          accumulate_kernel<D, S, kPack><<<grid_for(n / kPack, kThreads), kThreads, 0, compute_stream()>>>(
              ptr<D>(dst), ptr<S>(src), n);
          CUDA_LAUNCH_CHECK();
          return;
        }
      }
      accumulate_kernel<D, S, 1><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(ptr<D>(dst), ptr<S>(src),
                                                                                           n);
      CUDA_LAUNCH_CHECK();
    });
  });
}

void bias_add(const Tensor& out, const Tensor& bias) {
  const int64_t n = out.numel(), OC = bias.numel();
  if (n == 0) return;
  dispatch_dtype(out.dtype(), [&](auto s) {
    using S = decltype(s);
    constexpr int kPack = Pack<S>::kN;
    if (OC % kPack == 0 && aligned16(out.data()) && aligned16(bias.data()))
      bias_add_kernel<S, kPack><<<grid_for(n / kPack, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<S>(out), ptr<S>(bias), n, OC);
    else
      bias_add_kernel<S, 1><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(ptr<S>(out), ptr<S>(bias), n,
                                                                                     OC);
    CUDA_LAUNCH_CHECK();
  });
}

void divide_(const Tensor& t, int divisor) {
  const int64_t n = t.numel();
  if (n == 0) return;
  dispatch_dtype(t.dtype(), [&](auto s) {
    using S = decltype(s);
    divide_kernel<S><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(ptr<S>(t), float(divisor), n);
    CUDA_LAUNCH_CHECK();
  });
}

}  // namespace mt::kernels::gpu
