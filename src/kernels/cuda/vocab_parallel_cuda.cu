// GPU vocab-parallel cross-entropy steps: one block per row for the row-wise passes (max; sum of exp; gradient),
// 16-byte packs when Vl is a multiple of the pack and the pointers are aligned. Block reductions are warp
// shuffles then shared memory, in a fixed order: deterministic. All arithmetic in A (fp32, fp64 for fp64), each
// dlogit rounded once; the loss is log(sum) + max - target logit in double, as the CPU. The target logit comes
// from the reduced stats, so dlogits may overwrite logits in place (each element is read, then written, by one
// thread; no __restrict__).
// Targets cannot be range-checked on the host without a synchronisation: a target outside [0, vocab) is never
// used as an address, contributes nothing to the local sums, and gives a NaN loss in the finishing step.
#include "kernels/cuda/vocab_parallel_cuda.h"

#include <cstdint>
#include <limits>

#include "kernels/cuda/common.cuh"

namespace mt::kernels::gpu {
namespace {

constexpr int kMaxThreads = 512;

__device__ __forceinline__ float exp_acc(float x) { return expf(x); }
__device__ __forceinline__ double exp_acc(double x) { return exp(x); }
__device__ __forceinline__ float max_acc(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_acc(double a, double b) { return fmax(a, b); }

struct SumOp {
  template <typename A>
  __device__ A operator()(A a, A b) const { return a + b; }
};
struct MaxOp {
  template <typename A>
  __device__ A operator()(A a, A b) const { return max_acc(a, b); }
};

// The block's reduction of v, returned to every thread. blockDim.x is a multiple of 32.
template <typename A, typename Op>
__device__ A block_reduce(A v, A identity, Op op) {
  __shared__ A partial[32];
  __shared__ A result;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? partial[lane] : identity;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) result = v;
  }
  __syncthreads();
  return result;
}

// row_max[n] = max over the first nreal logits of row n (-inf when nreal = 0). V divides Vl.
template <typename S, int V>
__global__ void local_max_kernel(acc_t<S>* row_max, const S* logits, int Vl, int nreal) {
  using A = acc_t<S>;
  const A lowest = -std::numeric_limits<A>::infinity();
  const S* l = logits + int64_t(blockIdx.x) * Vl;
  A m = lowest;
  for (int j = threadIdx.x * V; j < nreal; j += blockDim.x * V) {
    A x[V];
    load_n<V>(x, l + j);
#pragma unroll
    for (int i = 0; i < V; ++i)
      if (j + i < nreal) m = max_acc(m, x[i]);
  }
  m = block_reduce(m, lowest, MaxOp{});
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

// stats[0, n] = sum over real j of exp(l - row_max[n]); stats[1, n] = l[target - v0] if this rank owns it, else 0.
template <typename S, int V>
__global__ void local_sums_kernel(acc_t<S>* stats, const S* logits, const int32_t* targets, const acc_t<S>* row_max,
                                  int64_t N, int Vl, int64_t v0, int nreal) {
  using A = acc_t<S>;
  const int64_t row = blockIdx.x;
  const S* l = logits + row * Vl;
  const A mx = row_max[row];
  A s = 0;
  for (int j = threadIdx.x * V; j < nreal; j += blockDim.x * V) {
    A x[V];
    load_n<V>(x, l + j);
#pragma unroll
    for (int i = 0; i < V; ++i)
      if (j + i < nreal) s += exp_acc(x[i] - mx);
  }
  s = block_reduce(s, A(0), SumOp{});
  if (threadIdx.x == 0) {
    const int64_t j = int64_t(targets[row]) - v0;  // a target in [0, vocab) owned here is a real column
    stats[row] = s;
    stats[N + row] = (j >= 0 && j < nreal) ? to_acc(l[j]) : A(0);
  }
}

template <typename L>
__device__ __forceinline__ L loss_of(double sum, double mx, double target_logit, bool valid) {
  return valid ? L(log(sum) + mx - target_logit) : L(__longlong_as_double(0x7ff8000000000000ll));
}

// Losses only: one thread per row.
template <typename A, typename L>
__global__ void losses_kernel(L* losses, const int32_t* targets, const A* row_max, const A* stats, int64_t N,
                              int64_t vocab) {
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N; n += int64_t(gridDim.x) * blockDim.x)
    losses[n] = loss_of<L>(double(stats[n]), double(row_max[n]), double(stats[N + n]),
                           targets[n] >= 0 && targets[n] < vocab);
}

// Losses and this rank's gradient slice: one block per row. V divides Vl.
template <typename S, typename L, int V>
__global__ void finish_kernel(L* losses, S* dlogits, const S* logits, const int32_t* targets, const acc_t<S>* row_max,
                              const acc_t<S>* stats, int64_t N, int Vl, int64_t v0, int64_t vocab, int nreal,
                              double dloss) {
  using A = acc_t<S>;
  const int64_t row = blockIdx.x;
  const A mx = row_max[row];
  const double sum = double(stats[row]);
  const int64_t t = targets[row];
  if (threadIdx.x == 0) losses[row] = loss_of<L>(sum, double(mx), double(stats[N + row]), t >= 0 && t < vocab);
  const int64_t hot_col = t - v0;  // the target's local column (outside [0, nreal): not this rank's)
  const A scale = A(dloss / sum), hot = A(dloss);
  const S* l = logits + row * Vl;
  S* d = dlogits + row * Vl;
  for (int j = threadIdx.x * V; j < Vl; j += blockDim.x * V) {
    A x[V];
    load_n<V>(x, l + j);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      if (j + i < nreal) {
        x[i] = exp_acc(x[i] - mx) * scale;
        if (j + i == hot_col && t < vocab) x[i] -= hot;
      } else {
        x[i] = A(0);
      }
    }
    store_n<V>(d + j, x);
  }
}

// Threads for one block per row: enough that each takes a few accesses of a wide row, never more than it has.
int row_threads(int64_t accesses) {
  return static_cast<int>(std::min<int64_t>(kMaxThreads, std::max<int64_t>(32, (accesses + 31) / 32 * 32)));
}

void check_dims(int64_t N, int64_t Vl, const char* op) {
  MT_CHECK(Vl <= INT32_MAX && N <= INT32_MAX, "{} (cuda): N = {} rows of Vl = {} must each be < 2^31", op, N, Vl);
}

}  // namespace

void vocab_parallel_xent_local_max(const Tensor& row_max, const Tensor& logits, int64_t nreal) {
  const int64_t Vl = logits.dim(-1), N = logits.numel() / Vl;
  check_dims(N, Vl, "vocab_parallel_xent_local_max");
  if (N == 0) return;
  dispatch_dtype(logits.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = acc_t<S>;
    constexpr int kPack = Pack<S>::kN;
    if (Vl % kPack == 0 && aligned16(logits.data()))
      local_max_kernel<S, kPack><<<N, row_threads(Vl / kPack), 0, compute_stream()>>>(ptr<A>(row_max), ptr<S>(logits),
                                                                                      int(Vl), int(nreal));
    else
      local_max_kernel<S, 1><<<N, row_threads(Vl), 0, compute_stream()>>>(ptr<A>(row_max), ptr<S>(logits), int(Vl),
                                                                           int(nreal));
    CUDA_LAUNCH_CHECK();
  });
}

void vocab_parallel_xent_local_sums(const Tensor& stats, const Tensor& logits, const Tensor& targets,
                                    const Tensor& row_max, int64_t v0, int64_t nreal) {
  const int64_t Vl = logits.dim(-1), N = logits.numel() / Vl;
  check_dims(N, Vl, "vocab_parallel_xent_local_sums");
  if (N == 0) return;
  dispatch_dtype(logits.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = acc_t<S>;
    constexpr int kPack = Pack<S>::kN;
    if (Vl % kPack == 0 && aligned16(logits.data()))
      local_sums_kernel<S, kPack><<<N, row_threads(Vl / kPack), 0, compute_stream()>>>(
          ptr<A>(stats), ptr<S>(logits), ptr<int32_t>(targets), ptr<A>(row_max), N, int(Vl), v0, int(nreal));
    else
      local_sums_kernel<S, 1><<<N, row_threads(Vl), 0, compute_stream()>>>(
          ptr<A>(stats), ptr<S>(logits), ptr<int32_t>(targets), ptr<A>(row_max), N, int(Vl), v0, int(nreal));
    CUDA_LAUNCH_CHECK();
  });
}

void vocab_parallel_xent_finish(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                const Tensor& targets, const Tensor& row_max, const Tensor& stats, int64_t v0,
                                int64_t vocab, int64_t nreal, double dloss) {
  const int64_t Vl = logits.dim(-1), N = logits.numel() / Vl;
  check_dims(N, Vl, "vocab_parallel_xent_finish");
  if (N == 0) return;
  dispatch_dtype(logits.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = acc_t<S>;
    auto run = [&](auto* loss_ptr) {
      using L = std::remove_pointer_t<decltype(loss_ptr)>;
      const int32_t* t = ptr<int32_t>(targets);
      if (!dlogits.defined()) {
        losses_kernel<A, L><<<grid_for(N, 256), 256, 0, compute_stream()>>>(loss_ptr, t, ptr<A>(row_max),
                                                                            ptr<A>(stats), N, vocab);
      } else {
        constexpr int kPack = Pack<S>::kN;
        S* d = ptr<S>(dlogits);
        if (Vl % kPack == 0 && aligned16(logits.data()) && aligned16(d))
          finish_kernel<S, L, kPack><<<N, row_threads(Vl / kPack), 0, compute_stream()>>>(
              loss_ptr, d, ptr<S>(logits), t, ptr<A>(row_max), ptr<A>(stats), N, int(Vl), v0, vocab, int(nreal),
              dloss);
        else
          finish_kernel<S, L, 1><<<N, row_threads(Vl), 0, compute_stream()>>>(
              loss_ptr, d, ptr<S>(logits), t, ptr<A>(row_max), ptr<A>(stats), N, int(Vl), v0, vocab, int(nreal),
              dloss);
      }
      CUDA_LAUNCH_CHECK();
    };
    if (losses.dtype() == DType::F32) run(ptr<float>(losses));
    else run(ptr<double>(losses));
  });
}

}  // namespace mt::kernels::gpu
