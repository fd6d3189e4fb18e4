// GPU RMSNorm forward and backward (kernels/rmsnorm.h), laid out as the GPU LayerNorm (layernorm_cuda.cu).
// One warp per row of C; each lane walks the row in 16-byte packs (8 bf16/fp16, 4 fp32, 2 fp64) when C is a
// multiple of the pack and every pointer is 16-byte aligned, else element by element. The sum of squares is in the
// accumulation type A as on the CPU (in another order: warp lanes, then a shuffle tree); each 16-bit output is
// rounded once.
// Backward: a warp per row for dinp (+=); dweight (+=) is summed per block in shared memory (A) and added to the
// global gradient with one atomicAdd per column per block, so its rounding depends on the order blocks finish:
// NOT bitwise deterministic (dinp, out and rstd are).
#include "kernels/cuda/rmsnorm_cuda.h"

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mt::kernels::gpu {
namespace {

constexpr int kWarp = 32;
constexpr int kForwardRowsPerBlock = 8;  // 256 threads: a warp per row
constexpr int kBackwardThreads = 512;    // 16 warps share one block's dweight partial sums
constexpr size_t kMaxSharedBytes = 48 * 1024;

__device__ __forceinline__ float rsqrt_acc(float x) { return 1.0f / sqrtf(x); }  // IEEE sqrt and divide, as the CPU
__device__ __forceinline__ double rsqrt_acc(double x) { return 1.0 / sqrt(x); }

// Forward over rows of C: out = x * r * w with r = 1 / sqrt(mean(x^2) + eps); the row is re-read from L1/L2.
template <typename S, int V>
__global__ void rmsnorm_forward_kernel(S* out, acc_t<S>* rstd, const S* inp, const S* weight, int64_t N, int C,
                                       acc_t<S> eps) {
  using A = acc_t<S>;
  const int64_t row = int64_t(blockIdx.x) * kForwardRowsPerBlock + threadIdx.x / kWarp;
  if (row >= N) return;  // the whole warp leaves together, so the shuffles below see every lane
  const int lane = threadIdx.x % kWarp;
  const S* x = inp + row * C;

  A sq = 0;
  for (int c = lane * V; c < C; c += kWarp * V) {
    A v[V];
    load_n<V>(v, x + c);
#pragma unroll
    for (int i = 0; i < V; ++i) sq += v[i] * v[i];
  }
  const A r = rsqrt_acc(warp_sum(sq) / A(C) + eps);

  for (int c = lane * V; c < C; c += kWarp * V) {
    A v[V], w[V], y[V];
    load_n<V>(v, x + c), load_n<V>(w, weight + c);
#pragma unroll
    for (int i = 0; i < V; ++i) y[i] = v[i] * r * w[i];
    store_n<V>(out + row * C + c, y);
  }
  if (lane == 0) rstd[row] = r;
}

// Backward: warps stride over rows. Per row, dinp += r * (g - xhat * mean(g * xhat)) with g = dout * weight and
// xhat = x * r, as the CPU. dweight += dout * xhat goes into the block's shared partial sums (kSharedPartials) and
// then into the global gradient with one atomicAdd per column, or, for rows too wide for shared memory, straight
// into the global gradient.
template <typename S, int V, bool kSharedPartials>
__global__ void rmsnorm_backward_kernel(S* dinp, acc_t<S>* dweight, const S* dout, const S* inp, const S* weight,
                                        const acc_t<S>* rstd, int64_t N, int C) {
  using A = acc_t<S>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  A* part_w = reinterpret_cast<A*>(shared_bytes);
  if constexpr (kSharedPartials) {
    for (int i = threadIdx.x; i < C; i += blockDim.x) part_w[i] = 0;
    __syncthreads();
  }
  A* sink_w = kSharedPartials ? part_w : dweight;

  const int lane = threadIdx.x % kWarp;
  const int warps = blockDim.x / kWarp;
  for (int64_t row = int64_t(blockIdx.x) * warps + threadIdx.x / kWarp; row < N;
       row += int64_t(gridDim.x) * warps) {  // warp-uniform loop: the shuffles see every lane
    const int64_t off = row * C;
    const A r = rstd[row];
    A sgx = 0;
    for (int c = lane * V; c < C; c += kWarp * V) {
      A dy[V], x[V], w[V];
      load_n<V>(dy, dout + off + c), load_n<V>(x, inp + off + c), load_n<V>(w, weight + c);
#pragma unroll
      for (int i = 0; i < V; ++i) sgx += dy[i] * w[i] * x[i] * r;
    }
    const A mgx = warp_sum(sgx) / A(C);
    for (int c = lane * V; c < C; c += kWarp * V) {
      A dy[V], x[V], w[V], dx[V];
      load_n<V>(dy, dout + off + c), load_n<V>(x, inp + off + c), load_n<V>(w, weight + c);
      load_n<V>(dx, dinp + off + c);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        dx[i] += r * (dy[i] * w[i] - x[i] * r * mgx);
        atomicAdd(sink_w + c + i, dy[i] * x[i] * r);
      }
      store_n<V>(dinp + off + c, dx);
    }
  }
  if constexpr (kSharedPartials) {
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += blockDim.x) atomicAdd(dweight + i, part_w[i]);
  }
}

template <typename S, int V>
void launch_backward(S* dinp, acc_t<S>* dweight, const S* dout, const S* inp, const S* weight, const acc_t<S>* rstd,
                     int64_t N, int C) {
  const int warps = kBackwardThreads / kWarp;
  // A few blocks per SM: enough warps to hide latency, few enough that the per-block atomics stay cheap.
  const int blocks = static_cast<int>(std::min<int64_t>((N + warps - 1) / warps, int64_t(2) * sm_count()));
  const size_t shared = size_t(C) * sizeof(acc_t<S>);
  if (shared <= kMaxSharedBytes)
    rmsnorm_backward_kernel<S, V, true><<<blocks, kBackwardThreads, shared, compute_stream()>>>(
        dinp, dweight, dout, inp, weight, rstd, N, C);
  else
    rmsnorm_backward_kernel<S, V, false><<<blocks, kBackwardThreads, 0, compute_stream()>>>(
        dinp, dweight, dout, inp, weight, rstd, N, C);
  CUDA_LAUNCH_CHECK();
}

void row_dims(const Tensor& x, int64_t& N, int& C) {
  const int64_t c = x.dim(-1);
  MT_CHECK(c >= 1 && c <= INT32_MAX, "rmsnorm (cuda): C = {} must be in [1, 2^31)", c);
  C = static_cast<int>(c);
  N = x.numel() / c;
}

}  // namespace

void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight, double eps) {
  int64_t N;
  int C;
  row_dims(inp, N, C);
  if (N == 0) return;
  dispatch_dtype(inp.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = acc_t<S>;
    constexpr int kPack = Pack<S>::kN;
    const bool vec = C % kPack == 0 && aligned16(out.data()) && aligned16(inp.data()) && aligned16(weight.data());
    const dim3 grid(static_cast<unsigned>((N + kForwardRowsPerBlock - 1) / kForwardRowsPerBlock));
    const dim3 block(kForwardRowsPerBlock * kWarp);
    if (vec)
      rmsnorm_forward_kernel<S, kPack><<<grid, block, 0, compute_stream()>>>(ptr<S>(out), ptr<A>(rstd), ptr<S>(inp),
                                                                            ptr<S>(weight), N, C, A(eps));
    else
      rmsnorm_forward_kernel<S, 1><<<grid, block, 0, compute_stream()>>>(ptr<S>(out), ptr<A>(rstd), ptr<S>(inp),
                                                                        ptr<S>(weight), N, C, A(eps));
    CUDA_LAUNCH_CHECK();
  });
}

void rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                      const Tensor& weight, const Tensor& rstd) {
  int64_t N;
  int C;
  row_dims(inp, N, C);
  if (N == 0) return;
  dispatch_dtype(inp.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = acc_t<S>;
    constexpr int kPack = Pack<S>::kN;
    bool vec = C % kPack == 0;
    for (const Tensor* t : {&dinp, &dout, &inp, &weight}) vec = vec && aligned16(t->data());
    if (vec)
      launch_backward<S, kPack>(ptr<S>(dinp), ptr<A>(dweight), ptr<S>(dout), ptr<S>(inp), ptr<S>(weight), ptr<A>(rstd),
                                N, C);
    else
      launch_backward<S, 1>(ptr<S>(dinp), ptr<A>(dweight), ptr<S>(dout), ptr<S>(inp), ptr<S>(weight), ptr<A>(rstd), N,
                            C);
  });
}

}  // namespace mt::kernels::gpu
