// GPU embedding. Forward: a grid-stride loop over 16-byte packs of out (element by element when C is not a
// multiple of the pack or a pointer is unaligned); a single table's row is copied exactly, a token + position sum
// is formed in A and rounded once, as on the CPU.
// Backward: dwpe[t, c] += dout[b, t, c] for b = 0, 1, ... in order, one thread per (t, c): no atomics, and the
// same additions in the same order as the CPU, so dwpe is bitwise the CPU's. dwte uses one atomicAdd (fp32, or
// fp64 for fp64) per element, so a token id repeated in the batch sums in an order that varies: dwte is not
// bitwise deterministic.
// Token ids cannot be range-checked on the host without a synchronisation. On the GPU an id outside
// [0, vocab_bound) never reads or writes outside the tables: its output row is NaN (so the loss shows it) and its
// dwte contribution is dropped.
#include "kernels/cuda/embedding_cuda.h"

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mt::kernels::gpu {
namespace {

constexpr int kThreads = 256;

template <typename A>
__device__ __forceinline__ A quiet_nan() {
  return A(__int_as_float(0x7fc00000));
}

// V consecutive elements; V > 1 only for 16-byte-aligned pointers.
template <int V, typename S>
struct Chunk {
  S v[V];
};
template <int V, typename S>
__device__ __forceinline__ Chunk<V, S> load_chunk(const S* p) {
  Chunk<V, S> c;
  if constexpr (V == 1) {
    c.v[0] = p[0];
  } else {
    const Pack<S> pk = *reinterpret_cast<const Pack<S>*>(p);
#pragma unroll
    for (int i = 0; i < V; ++i) c.v[i] = pk.v[i];
  }
  return c;
}
template <int V, typename S>
__device__ __forceinline__ void store_chunk(S* p, const Chunk<V, S>& c) {
  if constexpr (V == 1) {
    p[0] = c.v[0];
  } else {
    Pack<S> pk;
#pragma unroll
    for (int i = 0; i < V; ++i) pk.v[i] = c.v[i];
    *reinterpret_cast<Pack<S>*>(p) = pk;
  }
}

// V divides C, so a chunk lies within one (b, t) row.
template <typename S, int V>
__global__ void embedding_forward_kernel(S* out, const int32_t* tokens, const S* wte, const S* wpe, int64_t BT,
                                         int64_t T, int64_t C, int64_t v0, int64_t rows, int64_t bound) {
  using A = acc_t<S>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t p = first; p < BT * C / V; p += stride) {
    const int64_t i = p * V, bt = i / C, c = i % C;
    const int64_t id = tokens[bt], row = id - v0;
    Chunk<V, S> o;
    if (id < 0 || id >= bound) {
#pragma unroll
      for (int k = 0; k < V; ++k) o.v[k] = from_acc<S>(quiet_nan<A>());
    } else if (row >= 0 && row < rows) {
      o = load_chunk<V>(wte + row * C + c);
      if (wpe) {
        const Chunk<V, S> pos = load_chunk<V>(wpe + (bt % T) * C + c);
#pragma unroll
        for (int k = 0; k < V; ++k) o.v[k] = from_acc<S>(to_acc(o.v[k]) + to_acc(pos.v[k]));
      }
    } else if (wpe) {  // another tp rank holds this token's row
      o = load_chunk<V>(wpe + (bt % T) * C + c);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) o.v[k] = from_acc<S>(A(0));
    }
    store_chunk<V>(out + i, o);
  }
}

template <typename S>
__global__ void embedding_backward_wte_kernel(acc_t<S>* dwte, const S* dout, const int32_t* tokens, int64_t BT,
                                              int64_t C, int64_t v0, int64_t rows, int64_t bound) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < BT * C; i += stride) {
    const int64_t bt = i / C, c = i % C;
    const int64_t id = tokens[bt], row = id - v0;
    if (id < 0 || id >= bound || row < 0 || row >= rows) continue;
    atomicAdd(dwte + row * C + c, to_acc(dout[i]));
  }
}

// One thread per (t, c): dwpe[t, c] += dout[0, t, c], += dout[1, t, c], ... in the CPU's order.
template <typename S>
__global__ void embedding_backward_wpe_kernel(acc_t<S>* dwpe, const S* dout, int64_t B, int64_t T, int64_t C) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < T * C; i += stride) {
    acc_t<S> s = dwpe[i];
    for (int64_t b = 0; b < B; ++b) s += to_acc(dout[b * T * C + i]);
    dwpe[i] = s;
  }
}

}  // namespace

void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t v0,
                       int64_t vocab_bound) {
  const int64_t B = tokens.dim(0), T = tokens.dim(1), C = wte.dim(1), rows = wte.dim(0);
  if (B * T * C == 0) return;
  dispatch_dtype(wte.dtype(), [&](auto s) {
    using S = decltype(s);
    constexpr int kPack = Pack<S>::kN;
    const S* pos = wpe.defined() ? ptr<S>(wpe) : nullptr;
    if (C % kPack == 0 && aligned16(out.data()) && aligned16(wte.data()) && aligned16(pos))
      embedding_forward_kernel<S, kPack><<<grid_for(B * T * C / kPack, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<S>(out), ptr<int32_t>(tokens), ptr<S>(wte), pos, B * T, T, C, v0, rows, vocab_bound);
    else
      embedding_forward_kernel<S, 1><<<grid_for(B * T * C, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<S>(out), ptr<int32_t>(tokens), ptr<S>(wte), pos, B * T, T, C, v0, rows, vocab_bound);
    CUDA_LAUNCH_CHECK();
  });
}

void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens, int64_t v0,
                        int64_t vocab_bound) {
  const int64_t B = tokens.dim(0), T = tokens.dim(1), C = dwte.dim(1), rows = dwte.dim(0);
  if (B * T * C == 0) return;
  dispatch_dtype(dout.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = acc_t<S>;
    embedding_backward_wte_kernel<S><<<grid_for(B * T * C, kThreads), kThreads, 0, compute_stream()>>>(
        ptr<A>(dwte), ptr<S>(dout), ptr<int32_t>(tokens), B * T, C, v0, rows, vocab_bound);
    CUDA_LAUNCH_CHECK();
    if (dwpe.defined()) {
      embedding_backward_wpe_kernel<S><<<grid_for(T * C, kThreads), kThreads, 0, compute_stream()>>>(
          ptr<A>(dwpe), ptr<S>(dout), B, T, C);
      CUDA_LAUNCH_CHECK();
    }
  });
}

}  // namespace mt::kernels::gpu
