// GPU fused softmax + cross-entropy: one block per row of Vp logits. Pass 1 reads the row once and keeps, per
// thread, an online (running max, sum of exp(l - running max)) pair over the real columns [0, vocab); the pairs
// are combined across the block (warp shuffles, then shared memory) in a fixed order. Pass 2 writes the gradient
// (exp(l - max) * (dloss / sum) - [j == target] dloss, 0 in padding columns), rounded once per element. Loads and
// stores are 16-byte packs when Vp is a multiple of the pack and the pointers are aligned. Everything is in A
// (fp32, fp64 for fp64); the loss is log(sum) + max - target logit in double, as the CPU.
// In place (dlogits == logits): the target logit is read before the block's first barrier and every element is
// read before it is written by the same thread, so no pointer is __restrict__. Deterministic.
// Targets cannot be range-checked on the host without a synchronisation: a target outside [0, vocab) gives a NaN
// loss and no one-hot term, and is never used as an address.
#include "kernels/cuda/crossentropy_cuda.h"

#include <cstdint>
#include <limits>

#include "kernels/cuda/common.cuh"

namespace mt::kernels::gpu {
namespace {

constexpr int kMaxThreads = 512;

__device__ __forceinline__ float exp_acc(float x) { return expf(x); }
__device__ __forceinline__ double exp_acc(double x) { return exp(x); }

template <typename A>
__device__ __forceinline__ A neg_inf() {
  return -std::numeric_limits<A>::infinity();
}

// A running softmax denominator: sum = sum of exp(l - max) over the logits seen so far.
template <typename A>
struct MaxSum {
  A max, sum;
};

template <typename A>
__device__ __forceinline__ MaxSum<A> combine(MaxSum<A> a, MaxSum<A> b) {
  const A m = a.max > b.max ? a.max : b.max;
  if (m == neg_inf<A>()) return {m, A(0)};  // both empty: exp(-inf - -inf) would be NaN
  return {m, a.sum * exp_acc(a.max - m) + b.sum * exp_acc(b.max - m)};
}

template <typename A>
__device__ __forceinline__ void push(MaxSum<A>& ms, A x) {
  if (x > ms.max) {
    ms.sum = ms.sum * exp_acc(ms.max - x) + A(1);
    ms.max = x;
  } else {
    ms.sum += exp_acc(x - ms.max);
  }
}

// The block's combined pair, returned to every thread. blockDim.x is a multiple of 32.
template <typename A>
__device__ MaxSum<A> block_combine(MaxSum<A> v) {
  __shared__ A maxes[32], sums[32];
  __shared__ MaxSum<A> result;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int o = 16; o > 0; o >>= 1)
    v = combine(v, {__shfl_xor_sync(0xffffffffu, v.max, o), __shfl_xor_sync(0xffffffffu, v.sum, o)});
  if (lane == 0) maxes[warp] = v.max, sums[warp] = v.sum;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? MaxSum<A>{maxes[lane], sums[lane]} : MaxSum<A>{neg_inf<A>(), A(0)};
    for (int o = 16; o > 0; o >>= 1)
      v = combine(v, {__shfl_xor_sync(0xffffffffu, v.max, o), __shfl_xor_sync(0xffffffffu, v.sum, o)});
    if (lane == 0) result = v;
  }
  __syncthreads();
  return result;
}

// One block per row; V divides Vp.
template <typename S, typename L, int V>
__global__ void softmax_xent_kernel(L* losses, S* dlogits, const S* logits, const int32_t* targets, int Vp,
                                    int vocab, double dloss) {
  using A = acc_t<S>;
  const int64_t row = blockIdx.x;
  const S* l = logits + row * Vp;
  const int t = targets[row];
  const bool valid = t >= 0 && t < vocab;
  __shared__ A target_logit;
  if (threadIdx.x == 0) target_logit = valid ? to_acc(l[t]) : A(0);  // before any write (block_combine syncs)

  MaxSum<A> ms{neg_inf<A>(), A(0)};
  for (int j = threadIdx.x * V; j < vocab; j += blockDim.x * V) {
    A x[V];
    load_n<V>(x, l + j);
#pragma unroll
    for (int i = 0; i < V; ++i)
      if (j + i < vocab) push(ms, x[i]);
  }
  ms = block_combine(ms);
  if (threadIdx.x == 0)
    losses[row] = valid ? L(log(double(ms.sum)) + double(ms.max) - double(target_logit))
                        : L(__longlong_as_double(0x7ff8000000000000ll));
  if (!dlogits) return;

  S* d = dlogits + row * Vp;
  const A scale = A(dloss / double(ms.sum)), hot = A(dloss);
  for (int j = threadIdx.x * V; j < Vp; j += blockDim.x * V) {
    A x[V];
    load_n<V>(x, l + j);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      if (j + i < vocab) {
        x[i] = exp_acc(x[i] - ms.max) * scale;
        if (j + i == t) x[i] -= hot;
      } else {
        x[i] = A(0);
      }
    }
    store_n<V>(d + j, x);
  }
}

template <typename S, typename L>
void launch(L* losses, S* dlogits, const S* logits, const int32_t* targets, int64_t N, int Vp, int vocab,
            double dloss) {
  constexpr int kPack = Pack<S>::kN;
  const bool vec = Vp % kPack == 0 && aligned16(logits) && aligned16(dlogits);
  const int per_thread = vec ? kPack : 1;
  // Enough threads that each takes a few accesses of a GPT-2 row, never more than the row has accesses.
  const int accesses = (Vp + per_thread - 1) / per_thread;
  const int threads = std::min(kMaxThreads, std::max(32, (accesses + 31) / 32 * 32));
  if (vec)
    softmax_xent_kernel<S, L, kPack><<<N, threads, 0, compute_stream()>>>(losses, dlogits, logits, targets, Vp,
                                                                           vocab, dloss);
  else
    softmax_xent_kernel<S, L, 1><<<N, threads, 0, compute_stream()>>>(losses, dlogits, logits, targets, Vp, vocab,
                                                                       dloss);
  CUDA_LAUNCH_CHECK();
}

}  // namespace

void softmax_xent_forward_backward(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                   const Tensor& targets, int64_t vocab, double dloss) {
  const int64_t Vp = logits.dim(-1), N = logits.numel() / Vp;
  MT_CHECK(Vp <= INT32_MAX, "softmax_xent_forward_backward (cuda): Vp = {} must be < 2^31", Vp);
  MT_CHECK(N <= INT32_MAX, "softmax_xent_forward_backward (cuda): N = {} rows must be < 2^31", N);
  if (N == 0) return;
  dispatch_dtype(logits.dtype(), [&](auto s) {
    using S = decltype(s);
    S* d = dlogits.defined() ? ptr<S>(dlogits) : nullptr;
    const int32_t* t = ptr<int32_t>(targets);
    if (losses.dtype() == DType::F32)
      launch<S, float>(ptr<float>(losses), d, ptr<S>(logits), t, N, int(Vp), int(vocab), dloss);
    else
      launch<S, double>(ptr<double>(losses), d, ptr<S>(logits), t, N, int(Vp), int(vocab), dloss);
  });
}

}  // namespace mt::kernels::gpu
