// GPU LayerNorm forward, fused residual add + LayerNorm forward, and backward (kernels/layernorm.h).
// One warp per row of C; each lane walks the row in 16-byte packs (8 bf16/fp16, 4 fp32, 2 fp64) when C is a
// multiple of the pack and every pointer is 16-byte aligned, else element by element. Statistics are two-pass in
// the accumulation type A as on the CPU (mean, then the sum of squared deviations: no E[x^2] - E[x]^2
// cancellation); the row is re-read from L1/L2 for each pass. Each 16-bit output is rounded once.
// Backward: a warp per row for dinp (+=); dweight/dbias (+=) are summed per block in shared memory (fp32, fp64
// for fp64) and added to the global fp32/fp64 gradients with one atomicAdd per column per block, so their
// rounding depends on the order blocks finish: NOT bitwise deterministic (dinp, out, mean, rstd are).
#include "kernels/cuda/layernorm_cuda.h"

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mt::kernels::gpu {
namespace {

constexpr int kWarp = 32;
constexpr int kForwardRowsPerBlock = 8;  // 256 threads: a warp per row
constexpr int kBackwardThreads = 512;    // 16 warps share one block's dweight/dbias partial sums
constexpr size_t kMaxSharedBytes = 48 * 1024;
constexpr int kMaxRegisterChunks = 4;    // rows up to 4 * 32 packs wide take layernorm_backward_registers_kernel

__device__ __forceinline__ float rsqrt_acc(float x) { return 1.0f / sqrtf(x); }  // IEEE sqrt and divide, as the CPU
__device__ __forceinline__ double rsqrt_acc(double x) { return 1.0 / sqrt(x); }

// Forward over rows of C. kResidual: the row is res = a + b (rounded once to S and stored), and the statistics
// and output are computed from the stored, rounded res; else the row is inp. No pointer is __restrict__: res may
// alias a or b. Each lane reads back only the elements it wrote itself, so the read-after-write needs no sync.
template <typename S, int V, bool kResidual>
__global__ void layernorm_forward_kernel(S* out, acc_t<S>* mean, acc_t<S>* rstd, const S* inp, S* res, const S* a,
                                         const S* b, const S* weight, const S* bias, int64_t N, int C,
                                         acc_t<S> eps) {
  using A = acc_t<S>;
  const int64_t row = int64_t(blockIdx.x) * kForwardRowsPerBlock + threadIdx.x / kWarp;
  if (row >= N) return;  // the whole warp leaves together, so the shuffles below see every lane
  const int lane = threadIdx.x % kWarp;
  const int64_t off = row * C;
  const S* x = kResidual ? res + off : inp + off;

  A sum = 0;
  for (int c = lane * V; c < C; c += kWarp * V) {
    A v[V];
    if constexpr (kResidual) {
      A va[V], vb[V];
      load_n<V>(va, a + off + c), load_n<V>(vb, b + off + c);
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = to_acc(from_acc<S>(va[i] + vb[i]));  // the rounded residual
      store_n<V>(res + off + c, v);  // exact: v already holds S values
    } else {
      load_n<V>(v, x + c);
    }
#pragma unroll
    for (int i = 0; i < V; ++i) sum += v[i];
  }
  const A m = warp_sum(sum) / A(C);

  A sq = 0;
  for (int c = lane * V; c < C; c += kWarp * V) {
    A v[V];
    load_n<V>(v, x + c);
#pragma unroll
    for (int i = 0; i < V; ++i) sq += (v[i] - m) * (v[i] - m);
  }
  const A r = rsqrt_acc(warp_sum(sq) / A(C) + eps);

  for (int c = lane * V; c < C; c += kWarp * V) {
    A v[V], w[V], bb[V], y[V];
    load_n<V>(v, x + c), load_n<V>(w, weight + c), load_n<V>(bb, bias + c);
#pragma unroll
    for (int i = 0; i < V; ++i) y[i] = (v[i] - m) * r * w[i] + bb[i];
    store_n<V>(out + off + c, y);
  }
  if (lane == 0) mean[row] = m, rstd[row] = r;
}

// Backward: warps stride over rows. Per row, dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)) with
// g = dout * weight, as the CPU. dweight += dout * xhat and dbias += dout go into the block's shared partial
// sums (kSharedPartials) and then into the global gradients with one atomicAdd per column, or, for rows too wide
// for shared memory, straight into the global gradients.
template <typename S, int V, bool kSharedPartials>
__global__ void layernorm_backward_kernel(S* dinp, acc_t<S>* dweight, acc_t<S>* dbias, const S* dout, const S* inp,
                                          const S* weight, const acc_t<S>* mean, const acc_t<S>* rstd, int64_t N,
                                          int C) {
  using A = acc_t<S>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  A* part_w = reinterpret_cast<A*>(shared_bytes);
  A* part_b = part_w + C;
  if constexpr (kSharedPartials) {
    for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) part_w[i] = 0;
    __syncthreads();
  }
  A* sink_w = kSharedPartials ? part_w : dweight;
  A* sink_b = kSharedPartials ? part_b : dbias;

  const int lane = threadIdx.x % kWarp;
  const int warps = blockDim.x / kWarp;
  for (int64_t row = int64_t(blockIdx.x) * warps + threadIdx.x / kWarp; row < N;
       row += int64_t(gridDim.x) * warps) {  // warp-uniform loop: the shuffles see every lane
    const int64_t off = row * C;
    const A m = mean[row], r = rstd[row];
    A sg = 0, sgx = 0;
    for (int c = lane * V; c < C; c += kWarp * V) {
      A dy[V], x[V], w[V];
      load_n<V>(dy, dout + off + c), load_n<V>(x, inp + off + c), load_n<V>(w, weight + c);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const A g = dy[i] * w[i];
        sg += g;
        sgx += g * (x[i] - m) * r;
      }
    }
    const A mg = warp_sum(sg) / A(C), mgx = warp_sum(sgx) / A(C);
    for (int c = lane * V; c < C; c += kWarp * V) {
      A dy[V], x[V], w[V], dx[V];
      load_n<V>(dy, dout + off + c), load_n<V>(x, inp + off + c), load_n<V>(w, weight + c);
      load_n<V>(dx, dinp + off + c);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        dx[i] += r * (dy[i] * w[i] - mg - (x[i] - m) * r * mgx);
        atomicAdd(sink_w + c + i, dy[i] * (x[i] - m) * r);
        atomicAdd(sink_b + c + i, dy[i]);
      }
      store_n<V>(dinp + off + c, dx);
    }
  }
  if constexpr (kSharedPartials) {
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
      atomicAdd(dweight + i, part_w[i]);
      atomicAdd(dbias + i, part_b[i]);
    }
  }
}

// Backward for rows of at most kChunks * 32 * V columns (GPT-2's 768 in bf16: 3 chunks): each lane owns the
// columns lane * V + k * 32 * V (k < kChunks) of every row its warp visits, keeps its dout and x of the row in
// registers (read once), and sums its dweight and dbias terms in registers over those rows. Only at the end do the
// block's warps add their sums into shared memory (one atomicAdd per column per warp, not per row: per-row shared
// atomics from 16 warps on the same columns were most of the time of layernorm_backward_kernel), then one global
// atomicAdd per column per block. dinp is the same per-row arithmetic, in the same order, as that kernel.
template <typename S, int V, int kChunks>
__global__ void __launch_bounds__(256) layernorm_backward_registers_kernel(
    S* dinp, acc_t<S>* dweight, acc_t<S>* dbias, const S* dout, const S* inp, const S* weight,
    const acc_t<S>* mean, const acc_t<S>* rstd, int64_t N, int C) {
  using A = acc_t<S>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  A* part_w = reinterpret_cast<A*>(shared_bytes);
  A* part_b = part_w + C;
  for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) part_w[i] = 0;
  __syncthreads();

  const int lane = threadIdx.x % kWarp;
  const int warps = blockDim.x / kWarp;
  A sum_w[kChunks][V] = {}, sum_b[kChunks][V] = {};
  for (int64_t row = int64_t(blockIdx.x) * warps + threadIdx.x / kWarp; row < N;
       row += int64_t(gridDim.x) * warps) {  // warp-uniform loop: the shuffles see every lane
    const int64_t off = row * C;
    const A m = mean[row], r = rstd[row];
    A dy[kChunks][V], x[kChunks][V];
    A sg = 0, sgx = 0;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int c = k * kWarp * V + lane * V;
      if (c >= C) break;
      A w[V];
      load_n<V>(dy[k], dout + off + c), load_n<V>(x[k], inp + off + c), load_n<V>(w, weight + c);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const A g = dy[k][i] * w[i];
        sg += g;
        sgx += g * (x[k][i] - m) * r;
      }
    }
    const A mg = warp_sum(sg) / A(C), mgx = warp_sum(sgx) / A(C);
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int c = k * kWarp * V + lane * V;
      if (c >= C) break;
      A w[V], dx[V];
      load_n<V>(w, weight + c), load_n<V>(dx, dinp + off + c);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        dx[i] += r * (dy[k][i] * w[i] - mg - (x[k][i] - m) * r * mgx);
        sum_w[k][i] += dy[k][i] * (x[k][i] - m) * r;
        sum_b[k][i] += dy[k][i];
      }
      store_n<V>(dinp + off + c, dx);
    }
  }
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = k * kWarp * V + lane * V;
    if (c >= C) break;
#pragma unroll
    for (int i = 0; i < V; ++i) atomicAdd(part_w + c + i, sum_w[k][i]), atomicAdd(part_b + c + i, sum_b[k][i]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    atomicAdd(dweight + i, part_w[i]);
    atomicAdd(dbias + i, part_b[i]);
  }
}

// Launches the forward kernel, vectorised when every row access can be a 16-byte pack.
template <typename S, bool kResidual>
void launch_forward(S* out, acc_t<S>* mean, acc_t<S>* rstd, const S* inp, S* res, const S* a, const S* b,
                    const S* weight, const S* bias, int64_t N, int C, double eps) {
  if (N == 0) return;
  constexpr int kPack = Pack<S>::kN;
  bool vec = C % kPack == 0;
  for (const void* p : {(const void*)out, (const void*)inp, (const void*)res, (const void*)a, (const void*)b,
                        (const void*)weight, (const void*)bias})
    vec = vec && aligned16(p);  // null (an unused argument) is aligned
  const int blocks = static_cast<int>((N + kForwardRowsPerBlock - 1) / kForwardRowsPerBlock);
  const dim3 grid(blocks), block(kForwardRowsPerBlock * kWarp);
  const acc_t<S> e = acc_t<S>(eps);
  if (vec)
    layernorm_forward_kernel<S, kPack, kResidual><<<grid, block, 0, compute_stream()>>>(
        out, mean, rstd, inp, res, a, b, weight, bias, N, C, e);
  else
    layernorm_forward_kernel<S, 1, kResidual><<<grid, block, 0, compute_stream()>>>(out, mean, rstd, inp, res, a,
                                                                                       b, weight, bias, N, C, e);
  CUDA_LAUNCH_CHECK();
}

template <typename S, int V>
void launch_backward(S* dinp, acc_t<S>* dweight, acc_t<S>* dbias, const S* dout, const S* inp, const S* weight,
                     const acc_t<S>* mean, const acc_t<S>* rstd, int64_t N, int C) {
  const int warps = kBackwardThreads / kWarp;
  // A few blocks per SM: enough warps to hide latency, few enough that the per-block atomics stay cheap.
  const int blocks = static_cast<int>(std::min<int64_t>((N + warps - 1) / warps, int64_t(2) * sm_count()));
  const size_t shared = 2 * size_t(C) * sizeof(acc_t<S>);
  const int chunks = (C + kWarp * V - 1) / (kWarp * V);
  if (shared <= kMaxSharedBytes && chunks <= kMaxRegisterChunks) {
    // 8 warps per block (the registers: 2 * kChunks * V sums and the row's dout and x per lane).
    const int reg_blocks = static_cast<int>(std::min<int64_t>((N + 7) / 8, int64_t(4) * sm_count()));
    auto launch = [&](auto kernel) {
      kernel<<<reg_blocks, 256, shared, compute_stream()>>>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    };
    switch (chunks) {
      case 1: launch(layernorm_backward_registers_kernel<S, V, 1>); break;
      case 2: launch(layernorm_backward_registers_kernel<S, V, 2>); break;
      case 3: launch(layernorm_backward_registers_kernel<S, V, 3>); break;
      default: launch(layernorm_backward_registers_kernel<S, V, 4>); break;
    }
  } else if (shared <= kMaxSharedBytes)
    layernorm_backward_kernel<S, V, true><<<blocks, kBackwardThreads, shared, compute_stream()>>>(
        dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  else
    layernorm_backward_kernel<S, V, false><<<blocks, kBackwardThreads, 0, compute_stream()>>>(
        dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  CUDA_LAUNCH_CHECK();
}

void row_dims(const Tensor& x, int64_t& N, int& C) {
  const int64_t c = x.dim(-1);
  MT_CHECK(c >= 1 && c <= INT32_MAX, "layernorm (cuda): C = {} must be in [1, 2^31)", c);
  C = static_cast<int>(c);
  N = x.numel() / c;
}

}  // namespace

void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias, double eps) {
  int64_t N;
  int C;
  row_dims(inp, N, C);
  dispatch_dtype(inp.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = acc_t<S>;
    launch_forward<S, false>(ptr<S>(out), ptr<A>(mean), ptr<A>(rstd), ptr<S>(inp), nullptr, nullptr, nullptr,
                             ptr<S>(weight), ptr<S>(bias), N, C, eps);
  });
}

void residual_layernorm_forward(const Tensor& residual_out, const Tensor& ln_out, const Tensor& mean,
                                const Tensor& rstd, const Tensor& a, const Tensor& b, const Tensor& weight,
                                const Tensor& bias, double eps) {
  int64_t N;
  int C;
  row_dims(a, N, C);
  dispatch_dtype(a.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = acc_t<S>;
    launch_forward<S, true>(ptr<S>(ln_out), ptr<A>(mean), ptr<A>(rstd), nullptr, ptr<S>(residual_out), ptr<S>(a),
                            ptr<S>(b), ptr<S>(weight), ptr<S>(bias), N, C, eps);
  });
}

void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
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
      launch_backward<S, kPack>(ptr<S>(dinp), ptr<A>(dweight), ptr<A>(dbias), ptr<S>(dout), ptr<S>(inp),
                                ptr<S>(weight), ptr<A>(mean), ptr<A>(rstd), N, C);
    else
      launch_backward<S, 1>(ptr<S>(dinp), ptr<A>(dweight), ptr<A>(dbias), ptr<S>(dout), ptr<S>(inp),
                            ptr<S>(weight), ptr<A>(mean), ptr<A>(rstd), N, C);
  });
}

}  // namespace mt::kernels::gpu
