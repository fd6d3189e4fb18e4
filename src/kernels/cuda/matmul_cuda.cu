// GPU matmul: cuBLASLt GEMMs for the forward product (bias and optionally GELU fused as epilogues), the input and
// weight gradients, and small deterministic kernels for the bias gradient. Everything runs on compute_stream().
//
// Row-major to cuBLASLt's column-major: a row-major matrix M [r, c] is, read column-major, M^T [c, r] with
// leading dimension c. So row-major X = Y Z is computed as the column-major X^T = Z^T Y^T: cuBLASLt's A is the
// right operand, B the left one, and D = X read column-major. The bias runs along D's rows (length m = OC), which
// is what the BIAS epilogue broadcasts. Each call is described by a GemmKey; its descriptors and the heuristic's
// algorithm are built on first use and cached, so the step loop makes no heuristic query after the first step.
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublaslt_library.h"
#include "kernels/cuda/matmul_cuda.h"

namespace mt::kernels::gpu {
namespace {

// 32 MiB: what cuBLASLt's larger Hopper kernels ask for (split-K and stream-K scratch).
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F64: return CUDA_R_64F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    case DType::F32: return CUDA_R_32F;
    default: MT_CHECK(false, "matmul on cuda: unsupported dtype {}", dtype_name(t));
  }
  return CUDA_R_32F;
}

// The largest power of two (at most 256) dividing the address: cuBLASLt chooses kernels by operand alignment,
// and views into flat buffers (parameters, arenas) need not be 256-byte aligned.
int alignment_of(const void* p) {
  if (p == nullptr) return 256;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int align = 1;
  while (align < 256 && a % (2 * align) == 0) align *= 2;
  return align;
}

// One GEMM in cuBLASLt's terms: D[m, n] = alpha op(A)[m, k] op(B)[k, n] + beta D (C aliases D), column-major.
struct Gemm {
  DType ab = DType::F32;  // A and B
  DType cd = DType::F32;  // C and D (fp32/fp64 for the accumulated weight gradient)
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* A = nullptr;
  int64_t lda = 0;
  const void* B = nullptr;
  int64_t ldb = 0;
  void* D = nullptr;
  int64_t ldd = 0;
  bool accumulate = false;  // beta = 1 (else 0)
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // BIAS / GELU_AUX_BIAS: m elements of cd's type
  void* aux = nullptr;         // GELU_AUX(_BIAS): the pre-GELU values in D's type, [m, n], leading dimension aux_ld
  int64_t aux_ld = 0;
};

// Everything the descriptors and the chosen algorithm depend on.
using GemmKey = std::tuple<int, int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int64_t,
                           int, int, int, int, int>;

GemmKey key_of(const Gemm& g) {
  return GemmKey{int(g.ab), int(g.cd), g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldd, int(g.epilogue),
                 g.aux_ld, alignment_of(g.A), alignment_of(g.B), alignment_of(g.D), alignment_of(g.bias),
                 alignment_of(g.aux)};
}

struct GemmPlan {
  bool found = false;  // the heuristic returned an algorithm
  cublasStatus_t heuristic_status = CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// The process's cuBLASLt state: created on first use, never destroyed (as the compute stream: destroying it after
// the CUDA runtime has shut down at exit fails). The mutex covers the plan cache and each call's pointer
// attributes, which live in the cached (shared) descriptor.
struct Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::mutex mu;
  std::map<GemmKey, GemmPlan> plans;
};

Lt& lt() {
  static Lt* state = [] {
    Lt* s = new Lt;
    CUBLAS_CHECK(cublaslt().cublasLtCreate(&s->handle));
    s->workspace = device_allocator().allocate(kWorkspaceBytes);
    return s;
  }();
  return *state;
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  CUBLAS_CHECK(cublaslt().cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

// The pointer attributes a call sets on its plan's descriptor (the heuristic also read them, for alignment).
void set_pointers(cublasLtMatmulDesc_t desc, const Gemm& g) {
  if (g.bias) set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  if (g.aux) set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
}

GemmPlan make_plan(Lt& s, const Gemm& g) {
  const CublasLt& api = cublaslt();
  GemmPlan p;
  const bool f64 = g.cd == DType::F64;
  const cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;  // 32F: no TF32
  const cudaDataType_t scale = f64 ? CUDA_R_64F : CUDA_R_32F;
  CUBLAS_CHECK(api.cublasLtMatmulDescCreate(&p.desc, compute, scale));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, ta);
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, tb);
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, g.epilogue);
  if (g.aux) {
    // int64_t, in elements. EPILOGUE_AUX_DATA_TYPE is left unset on purpose: unset, the GELU input matrix has D's
    // element type (cublasLt.h), which is what pre holds; setting it is only meant for fp8 outputs, and "if set
    // for an unsupported matrix data, scale, and compute type combination, calling cublasLtMatmul() will return
    // CUBLAS_INVALID_VALUE": a fatal error at the call rather than a heuristic miss the caller can fall back from.
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.aux_ld);
  }
  set_pointers(p.desc, g);
  // Layouts describe the stored matrices: op(A) = A^T means A is stored [k, m].
  const cudaDataType_t ab = cuda_type(g.ab), cd = cuda_type(g.cd);
  CUBLAS_CHECK(api.cublasLtMatrixLayoutCreate(&p.a, ab, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda));
  CUBLAS_CHECK(api.cublasLtMatrixLayoutCreate(&p.b, ab, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb));
  CUBLAS_CHECK(api.cublasLtMatrixLayoutCreate(&p.d, cd, g.m, g.n, g.ldd));

  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(api.cublasLtMatmulPreferenceCreate(&pref));
  auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attr, const auto& value) {
    CUBLAS_CHECK(api.cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
  };
  prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{kWorkspaceBytes});
  const uint32_t align_a = alignment_of(g.A), align_b = alignment_of(g.B), align_d = alignment_of(g.D);
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d);
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  // An unsupported combination (an epilogue on some dtype or alignment) answers an error status (NOT_SUPPORTED,
  // INVALID_VALUE) rather than zero results: either way there is no algorithm, and run_gemm decides whether that
  // is fatal (it reports the status).
  p.heuristic_status =
      api.cublasLtMatmulAlgoGetHeuristic(s.handle, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &count);
  CUBLAS_CHECK(api.cublasLtMatmulPreferenceDestroy(pref));
  p.found = p.heuristic_status == CUBLAS_STATUS_SUCCESS && count > 0;
  if (p.found) p.algo = result.algo;
  return p;
}

// Runs g; returns false (nothing issued) when cuBLASLt has no algorithm for it and `required` is false.
bool run_gemm(const Gemm& g, bool required) {
  Lt& s = lt();
  std::lock_guard<std::mutex> lock(s.mu);
  const GemmKey key = key_of(g);
  auto it = s.plans.find(key);
  if (it == s.plans.end()) it = s.plans.emplace(key, make_plan(s, g)).first;
  const GemmPlan& p = it->second;
  MT_CHECK(p.found || !required,
           "matmul on cuda: cuBLASLt has no algorithm for m={} n={} k={} ({} x {} -> {}, epilogue {}): heuristic {}",
           g.m, g.n, g.k, dtype_name(g.ab), dtype_name(g.ab), dtype_name(g.cd), int(g.epilogue),
           cublaslt().cublasLtGetStatusString(p.heuristic_status));
  if (!p.found) return false;
  set_pointers(p.desc, g);
  const float alpha32 = 1.0f, beta32 = g.accumulate ? 1.0f : 0.0f;
  const double alpha64 = 1.0, beta64 = g.accumulate ? 1.0 : 0.0;
  const bool f64 = g.cd == DType::F64;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = f64 ? static_cast<const void*>(&beta64) : &beta32;
  CUBLAS_CHECK(cublaslt().cublasLtMatmul(s.handle, p.desc, alpha, g.A, p.a, g.B, p.b, beta, g.D, p.d, g.D, p.d, &p.algo,
                              s.workspace, kWorkspaceBytes, compute_stream()));
  return true;
}

// out[N, OC] = bias in every row: with a beta = 1 GEMM after it, the bias path for dtypes or alignments the BIAS
// epilogue does not take (the result is the same: bias + the fp32/fp64 product, rounded once).
template <typename S>
__global__ void broadcast_rows_kernel(S* out, const S* bias, int64_t N, int64_t OC) {
  const int64_t total = N * OC;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = bias[i % OC];
}

// dbias[OC] += sum over n of dout[n, OC], deterministic (no atomics), in up to two launches. Block (bx, by) owns
// 32 columns and the by-th chunk of rows: thread (x, y) sums rows y, y + 32, ... of its chunk in column x (a warp
// reads 32 adjacent columns of one row: coalesced), then the 32 partial sums of each column are added in a fixed
// order. With one chunk that total is added to dbias; with several it goes to partials[by, OC], which
// bias_grad_sum_kernel adds up in chunk order. The chunks exist to fill the chip: GPT-2's OC = 768 alone is only
// 24 column blocks.
constexpr int kBiasCols = 32, kBiasRows = 32;
constexpr int64_t kBiasMinChunkRows = 128;  // fewer rows per block would spend more on the partials than on dout
template <typename S>
__global__ void __launch_bounds__(kBiasCols* kBiasRows)
    bias_grad_kernel(acc_t<S>* dbias, acc_t<S>* partials, const S* dout, int64_t N, int64_t OC, int64_t chunk_rows) {
  using A = acc_t<S>;
  __shared__ A partial[kBiasRows][kBiasCols + 1];
  const int64_t col = int64_t(blockIdx.x) * kBiasCols + threadIdx.x;
  const int64_t begin = int64_t(blockIdx.y) * chunk_rows, end = begin + chunk_rows < N ? begin + chunk_rows : N;
  A sum = 0;
  if (col < OC)
    for (int64_t n = begin + threadIdx.y; n < end; n += kBiasRows) sum += to_acc(dout[n * OC + col]);
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < OC) {
    A total = 0;
    for (int r = 0; r < kBiasRows; ++r) total += partial[r][threadIdx.x];
    if (partials)
      partials[int64_t(blockIdx.y) * OC + col] = total;
    else
      dbias[col] += total;
  }
}

template <typename A>
__global__ void bias_grad_sum_kernel(A* dbias, const A* partials, int64_t chunks, int64_t OC) {
  const int64_t col = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (col >= OC) return;
  A total = 0;
  for (int64_t c = 0; c < chunks; ++c) total += partials[c * OC + col];
  dbias[col] += total;
}

// How many row chunks bias_grad_kernel splits N into: enough blocks for two per multiprocessor, none shorter than
// kBiasMinChunkRows.
int64_t bias_grad_chunks(int64_t N, int64_t OC) {
  static const int sms = sm_count();
  const int64_t col_blocks = (OC + kBiasCols - 1) / kBiasCols;
  const int64_t wanted = (2 * int64_t(sms) + col_blocks - 1) / col_blocks;
  return std::max<int64_t>(1, std::min(wanted, N / kBiasMinChunkRows));
}

template <typename S>
void launch_bias_grad(acc_t<S>* dbias, const S* dout, int64_t N, int64_t OC) {
  using A = acc_t<S>;
  const int64_t chunks = bias_grad_chunks(N, OC);
  const int64_t chunk_rows = (N + chunks - 1) / chunks;
  const dim3 block(kBiasCols, kBiasRows);
  const dim3 grid(static_cast<unsigned>((OC + kBiasCols - 1) / kBiasCols), static_cast<unsigned>(chunks));
  if (chunks == 1) {
    bias_grad_kernel<S><<<grid, block, 0, compute_stream()>>>(dbias, nullptr, dout, N, OC, chunk_rows);
    CUDA_LAUNCH_CHECK();
    return;
  }
  // Handed back at once: every kernel runs on the one compute stream, so a later owner's work follows the sum.
  A* partials = static_cast<A*>(device_allocator().allocate(size_t(chunks * OC) * sizeof(A)));
  bias_grad_kernel<S><<<grid, block, 0, compute_stream()>>>(dbias, partials, dout, N, OC, chunk_rows);
  CUDA_LAUNCH_CHECK();
  bias_grad_sum_kernel<A><<<grid_for(OC, 256), 256, 0, compute_stream()>>>(dbias, partials, chunks, OC);
  CUDA_LAUNCH_CHECK();
  device_allocator().release(partials);
}

}  // namespace

void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias, int64_t N,
                    int64_t C, int64_t OC, WeightLayout layout) {
  if (N == 0 || OC == 0) return;
  MT_CHECK(C > 0, "matmul_forward on cuda: inp has no columns");
  // Column-major: out^T [OC, N] = op(W) [OC, C] @ inp^T [C, N].
  Gemm g;
  g.ab = g.cd = inp.dtype();
  g.m = OC, g.n = N, g.k = C;
  g.A = weight.data();
  g.trans_a = layout == WeightLayout::OutIn;  // InOut: W [C, OC] row-major is [OC, C] column-major as it is
  g.lda = layout == WeightLayout::InOut ? OC : C;
  g.B = inp.data(), g.ldb = C;
  g.D = out.data(), g.ldd = OC;
  if (bias.defined()) {
    Gemm fused = g;
    fused.epilogue = CUBLASLT_EPILOGUE_BIAS;
    fused.bias = bias.data();
    if (inp.dtype() != DType::F64 && run_gemm(fused, false)) return;
    dispatch_dtype(inp.dtype(), [&](auto s) {
      using S = decltype(s);
      broadcast_rows_kernel<S><<<grid_for(N * OC, 256), 256, 0, compute_stream()>>>(ptr<S>(out), ptr<S>(bias), N, OC);
      CUDA_LAUNCH_CHECK();
    });
    g.accumulate = true;
  }
  run_gemm(g, true);
}

void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight, int64_t N, int64_t C, int64_t OC, WeightLayout layout) {
  const bool inout = layout == WeightLayout::InOut;
  if (dinp.defined() && N > 0 && C > 0) {
    if (OC == 0) {
      CUDA_CHECK(cudaMemsetAsync(dinp.data(), 0, dinp.nbytes(), compute_stream()));
    } else {
      // dinp^T [C, N] = op(W) [C, OC] @ dout^T [OC, N]. InOut: W is [OC, C] column-major, so op = T.
      Gemm g;
      g.ab = g.cd = inp.dtype();
      g.m = C, g.n = N, g.k = OC;
      g.A = weight.data(), g.trans_a = inout, g.lda = inout ? OC : C;
      g.B = dout.data(), g.ldb = OC;
      g.D = dinp.data(), g.ldd = C;
      run_gemm(g, true);
    }
  }
  if (dweight.defined() && N > 0 && C > 0 && OC > 0) {
    // Accumulated (beta = 1) into the fp32/fp64 gradient from 16-bit (or fp32/fp64) operands.
    Gemm g;
    g.ab = inp.dtype(), g.cd = dweight.dtype();
    g.accumulate = true;
    g.k = N;
    if (inout) {  // dW [C, OC] row-major = [OC, C] column-major = dout^T [OC, N] @ inp [N, C]
      g.m = OC, g.n = C;
      g.A = dout.data(), g.lda = OC;
      g.B = inp.data(), g.trans_b = true, g.ldb = C;
      g.D = dweight.data(), g.ldd = OC;
    } else {  // dW [OC, C] row-major = [C, OC] column-major = inp^T [C, N] @ dout [N, OC]
      g.m = C, g.n = OC;
      g.A = inp.data(), g.lda = C;
      g.B = dout.data(), g.trans_b = true, g.ldb = OC;
      g.D = dweight.data(), g.ldd = C;
    }
    run_gemm(g, true);
  }
  if (dbias.defined() && N > 0 && OC > 0) {
    dispatch_dtype(inp.dtype(), [&](auto s) {
      using S = decltype(s);
      launch_bias_grad<S>(ptr<acc_t<S>>(dbias), ptr<S>(dout), N, OC);
    });
  }
}

bool matmul_bias_gelu_forward(const Tensor& pre, const Tensor& out, const Tensor& inp, const Tensor& weight,
                              const Tensor& bias, int64_t N, int64_t C, int64_t OC, WeightLayout layout) {
  const DType t = inp.dtype();
  // The aux (pre-GELU) matrix's leading dimension must be a multiple of 8 elements (cublasLt.h, EPILOGUE_AUX_LD).
  if ((t != DType::BF16 && t != DType::F16) || N == 0 || C == 0 || OC % 8 != 0) return false;
  Gemm g;
  g.ab = g.cd = t;
  g.m = OC, g.n = N, g.k = C;
  g.A = weight.data(), g.trans_a = layout == WeightLayout::OutIn, g.lda = layout == WeightLayout::InOut ? OC : C;
  g.B = inp.data(), g.ldb = C;
  g.D = out.data(), g.ldd = OC;
  g.epilogue = bias.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  g.bias = bias.defined() ? bias.data() : nullptr;
  g.aux = pre.data(), g.aux_ld = OC;
  return run_gemm(g, false);
}

}  // namespace mt::kernels::gpu
