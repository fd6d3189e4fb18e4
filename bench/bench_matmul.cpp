// bench_matmul: chooses the CPU matmul backend by measurement. For every matmul shape of the three reference
// configs (A, B, default) it times the forward product and the two backward products, in both weight layouts,
// with Eigen 3.4 (OpenMP-parallel GEMM), OpenBLAS (cblas_sgemm), oneDNN in fp32 and oneDNN in bf16 (fp32
// accumulation), and prints GFLOP/s and the ratios to Eigen. It then measures the peak throughput at 2048^3 of
// each (the machine's best sgemm rate is the best of the three fp32 libraries) and checks whether an OpenMP kernel
// followed by an OpenBLAS GEMM (the trainer's pattern) costs more than the two run separately (thread pools
// fighting). Finally it times the trainer's own kernels::matmul_forward/backward at config B's shapes, in fp32
// and bf16 with the libraries train.cpu_matmul=auto picks on this CPU.
//
//   build/bench/bench_matmul [threads=2] [seconds_per_case=0.15] [--peak-only]
#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <Eigen/Core>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_args.h"
#include "bench_timing.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "core/dtype.h"
#include "kernels/cpu/matmul_backend.h"
#include "kernels/cpu/onednn_gemm.h"
#include "kernels/matmul.h"

namespace {

using Clock = std::chrono::steady_clock;
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Map = Eigen::Map<RowMat>;

double g_seconds = 0.15;

double time_call(const std::function<void()>& f) { return mt::bench::time_best(f, g_seconds); }

// OpenBLAS picks its kernels from the CPU model at load time; a model newer than the library (Debian's 0.3.21 on
// an Intel Xeon of model 207) falls back to the SSE3 "Prescott" kernels at a fifth of the machine's rate, which
// would understate the best sgemm that other benchmarks hold the trainer to. On an AVX-512 CPU whose detected core
// has no AVX-512 kernels, run again with OpenBLAS's generic AVX-512 ones (OPENBLAS_CORETYPE is read at load time).
void openblas_on_avx512_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || !__builtin_cpu_supports("avx512f")) return;
  const std::string core = openblas_get_corename();
  for (const char* k : {"skylakex", "cooperlake", "sapphirerapids"})
    if (strcasecmp(core.c_str(), k) == 0) return;
  std::printf("OpenBLAS detected core %s on an AVX-512 CPU: running again with OPENBLAS_CORETYPE=SkylakeX\n",
              core.c_str());
  std::fflush(stdout);
  setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  execv("/proc/self/exe", argv);
  std::perror("bench_matmul: execv");  // not reached unless the re-run failed to start: measure as detected
}

void fill(std::vector<float>& v, unsigned seed) {
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
  }
}

struct Case {
  const char* config;
  int n, c, oc;
};

enum class Op { Fwd, BwdInp, BwdW };
const char* op_name(Op o) { return o == Op::Fwd ? "fwd" : o == Op::BwdInp ? "dinp" : "dW"; }

// One product with Eigen. inp[N,C], W[C,OC] (InOut) or [OC,C] (OutIn), out/dout[N,OC].
void eigen_op(Op op, bool outin, int n, int c, int oc, float* inp, float* w, float* out, float* dinp, float* dw) {
  Map A(inp, n, c), O(out, n, oc), DI(dinp, n, c);
  if (!outin) {
    Map W(w, c, oc), DW(dw, c, oc);
    if (op == Op::Fwd) O.noalias() = A * W;
    if (op == Op::BwdInp) DI.noalias() = O * W.transpose();
    if (op == Op::BwdW) DW.noalias() += A.transpose() * O;
  } else {
    Map W(w, oc, c), DW(dw, oc, c);
    if (op == Op::Fwd) O.noalias() = A * W.transpose();
    if (op == Op::BwdInp) DI.noalias() = O * W;
    if (op == Op::BwdW) DW.noalias() += O.transpose() * A;
  }
}

void blas_op(Op op, bool outin, int n, int c, int oc, float* inp, float* w, float* out, float* dinp, float* dw) {
  const auto R = CblasRowMajor;
  const auto N = CblasNoTrans, T = CblasTrans;
  if (!outin) {
    if (op == Op::Fwd) cblas_sgemm(R, N, N, n, oc, c, 1.f, inp, c, w, oc, 0.f, out, oc);
    if (op == Op::BwdInp) cblas_sgemm(R, N, T, n, c, oc, 1.f, out, oc, w, oc, 0.f, dinp, c);
    if (op == Op::BwdW) cblas_sgemm(R, T, N, c, oc, n, 1.f, inp, c, out, oc, 1.f, dw, oc);
  } else {
    if (op == Op::Fwd) cblas_sgemm(R, N, T, n, oc, c, 1.f, inp, c, w, c, 0.f, out, oc);
    if (op == Op::BwdInp) cblas_sgemm(R, N, N, n, c, oc, 1.f, out, oc, w, c, 0.f, dinp, c);
    if (op == Op::BwdW) cblas_sgemm(R, T, N, oc, c, n, 1.f, out, oc, inp, c, 1.f, dw, c);
  }
}

namespace onednn = mt::kernels::cpu::onednn;

// The same product on oneDNN, with the shapes kernels/cpu/matmul_cpu.cpp uses; bf16 operands live in the *16 buffers.
void onednn_op(Op op, bool outin, int n, int c, int oc, onednn::Type t, const void* inp, const void* w,
               void* out, void* dinp, float* dw) {
  if (op == Op::Fwd) onednn::gemm(onednn::forward_shape(n, c, oc, outin, t, false), inp, w, nullptr, out);
  if (op == Op::BwdInp) onednn::gemm(onednn::dinp_shape(n, c, oc, outin, t), out, w, nullptr, dinp);
  if (op == Op::BwdW)
    onednn::gemm(onednn::dweight_shape(n, c, oc, outin, t), outin ? out : inp, outin ? inp : out, nullptr, dw);
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = mt::float_to_bf16(v[i]);
  return r;
}

// An OpenMP elementwise kernel of the size of an MLP activation, like GELU or a residual add in the trainer.
void omp_elementwise(float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] = a[i] * 0.999f + b[i];
}

// The libraries measured; OpenBLAS runs last in every comparison (its spinning pool slows what follows).
enum Lib { kEigen, kOneDNN32, kOneDNN16, kOpenBLAS, kLibs };
const char* lib_name(int l) {
  static const char* names[] = {"Eigen", "oneDNN fp32", "oneDNN bf16", "OpenBLAS"};
  return names[l];
}
bool lib_runs(int l) { return (l != kOneDNN32 || onednn::available()) && (l != kOneDNN16 || onednn::has_avx512()); }

// Peak throughput (GFLOP/s) at 2048^3 of a library.
double peak(int lib) {
  const int S = 2048;
  std::vector<float> a(size_t(S) * S), b(size_t(S) * S), c(size_t(S) * S);
  fill(a, 4), fill(b, 5);
  const std::vector<uint16_t> a16 = to_bf16(a), b16 = to_bf16(b);
  std::vector<uint16_t> c16(c.size());
  double saved = g_seconds;
  g_seconds = 1.5;
  double t = time_call([&] {
    if (lib == kOpenBLAS)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, S, S, S, 1.f, a.data(), S, b.data(), S, 0.f, c.data(), S);
    else if (lib == kOneDNN32)
      onednn_op(Op::Fwd, false, S, S, S, onednn::Type::F32, a.data(), b.data(), c.data(), nullptr, nullptr);
    else if (lib == kOneDNN16)
      onednn_op(Op::Fwd, false, S, S, S, onednn::Type::BF16, a16.data(), b16.data(), c16.data(), nullptr, nullptr);
    else
      Map(c.data(), S, S).noalias() = Map(a.data(), S, S) * Map(b.data(), S, S);
  });
  g_seconds = saved;
  return 2.0 * S * S * S / t * 1e-9;
}

// The trainer's kernels::matmul_forward/backward (bias included) at config B's shapes, both layouts, in fp32 and
// bf16 on the libraries train.cpu_matmul=auto picks here.
void trainer_kernels(const std::vector<Case>& cases) {
  std::printf("\nmt::kernels::matmul (bias included), config B shapes, %s:\n",
              mt::kernels::cpu::describe(mt::kernels::cpu::matmul_backends()).c_str());
  for (mt::DType dt : {mt::DType::F32, mt::DType::BF16})
  for (int k = 5; k < 10; ++k) {
    const Case& cs = cases[k];
    for (int outin = 0; outin < 2; ++outin) {
      auto layout = outin ? mt::kernels::WeightLayout::OutIn : mt::kernels::WeightLayout::InOut;
      using mt::Tensor;
      using mt::DType;
      Tensor inp = Tensor::zeros({cs.n, cs.c}, dt), out = Tensor::zeros({cs.n, cs.oc}, dt);
      Tensor w = Tensor::zeros(outin ? mt::Shape{cs.oc, cs.c} : mt::Shape{cs.c, cs.oc}, dt);
      Tensor dw = Tensor::zeros(w.shape(), DType::F32), bias = Tensor::zeros({cs.oc}, dt);
      Tensor dbias = Tensor::zeros({cs.oc}, DType::F32), dinp = Tensor::zeros({cs.n, cs.c}, dt);
      double flops = 2.0 * cs.n * cs.c * cs.oc;
      double tf = time_call([&] { mt::kernels::matmul_forward(out, inp, w, bias, layout); });
      double tbw = time_call([&] { mt::kernels::matmul_backward(dinp, dw, dbias, out, inp, w, layout); });
      std::printf("  %s N=%d C=%d OC=%d %-5s forward %.1f GFLOP/s, backward %.1f GFLOP/s\n", mt::dtype_name(dt), cs.n,
                  cs.c, cs.oc, outin ? "OutIn" : "InOut", flops / tf * 1e-9, 2 * flops / tbw * 1e-9);
    }
  }
}

// Thread-pool interference: an OpenMP elementwise kernel, then a GEMM, repeated (config B's MLP-up shape),
// against the two timed alone. backend 0 = Eigen (same OpenMP pool), 1 = OpenBLAS.
void interference(int backend) {
  const int n = 1024, c = 384, oc = 1536;
  std::vector<float> inp(size_t(n) * c), w(size_t(c) * oc), out(size_t(n) * oc), buf(size_t(n) * oc);
  fill(inp, 6), fill(w, 7), fill(buf, 8);
  auto gemm = [&] {
    (backend ? blas_op : eigen_op)(Op::Fwd, false, n, c, oc, inp.data(), w.data(), out.data(), nullptr, nullptr);
  };
  auto elem = [&] { omp_elementwise(out.data(), buf.data(), int64_t(n) * oc); };
  double t_e = time_call(elem), t_g = time_call(gemm), t_seq = time_call([&] { elem(); gemm(); });
  std::printf("interference %-8s (N=%d C=%d OC=%d): elementwise alone %.3f ms, gemm alone %.3f ms, "
              "elementwise then gemm %.3f ms: %+.1f%% vs the sum\n",
              backend ? "OpenBLAS" : "Eigen", n, c, oc, t_e * 1e3, t_g * 1e3, t_seq * 1e3,
              (t_seq / (t_g + t_e) - 1) * 100);
}

}  // namespace

// Usage: bench_matmul [THREADS [SECONDS_PER_CASE]] [--peak-only]
int main(int argc, char** argv) {
  bool peak_only = false;
  std::vector<const char*> pos;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--peak-only") peak_only = true;
    else pos.push_back(argv[i]);
  }
  int threads = 2;
  if (pos.size() > 2 || (pos.size() > 0 && !mt::bench::arg_int(pos[0], 1, 4096, &threads)) ||
      (pos.size() > 1 && !mt::bench::arg_number(pos[1], 1e-3, 3600, &g_seconds))) {
    mt::bench::usage_exit("bench_matmul", "bad arguments",
                          "bench_matmul [THREADS >= 1 [SECONDS_PER_CASE > 0]] [--peak-only]");
  }
  openblas_on_avx512_kernels(argv);
  mt::set_compute_threads(threads);
  openblas_set_num_threads(threads);
  if (peak_only) {  // the machine's best sgemm rate among the fp32 libraries, for other benchmarks to quote
    double best = 0;
    int best_lib = kEigen;
    for (int l : {kEigen, kOneDNN32, kOpenBLAS}) {
      if (!lib_runs(l)) continue;
      const double p = peak(l);
      std::printf("sgemm 2048^3 %s: %.1f GFLOP/s\n", lib_name(l), p);
      if (p > best) best = p, best_lib = l;
    }
    std::printf("peak sgemm (best of Eigen, oneDNN, OpenBLAS: %s, 2048^3, %d threads): %.1f GFLOP/s (OpenBLAS core %s)\n",
                lib_name(best_lib), threads, best, openblas_get_corename());
    return 0;
  }
  std::printf("bench_matmul: threads=%d (omp %d, openblas %d, eigen %d), %s, oneDNN ISA %s\n", threads,
              omp_get_max_threads(), openblas_get_num_threads(), Eigen::nbThreads(), openblas_get_config(),
              onednn::isa_name().c_str());

  std::vector<Case> cases;
  const int shapesA[5][2] = {{256, 768}, {256, 256}, {256, 1024}, {1024, 256}, {256, 512}};
  const int shapesB[5][2] = {{384, 1152}, {384, 384}, {384, 1536}, {1536, 384}, {384, 2048}};
  const int shapesD[5][2] = {{128, 384}, {128, 128}, {128, 512}, {512, 128}, {128, 256}};
  for (auto& s : shapesA) cases.push_back({"A", 256, s[0], s[1]});
  for (auto& s : shapesB) cases.push_back({"B", 1024, s[0], s[1]});
  for (auto& s : shapesD) cases.push_back({"default", 512, s[0], s[1]});

  // Each backend runs all its cases in one pass, Eigen first: OpenBLAS's pthread pool keeps its workers spinning
  // for a while after every call, which would slow whatever OpenMP code ran next (see the interference test).
  struct Row {
    const Case* cs;
    int outin;
    Op op;
    double t[kLibs];
  };
  std::vector<Row> rows;
  for (const Case& cs : cases)
    for (int outin = 0; outin < 2; ++outin)
      for (Op op : {Op::Fwd, Op::BwdInp, Op::BwdW}) rows.push_back({&cs, outin, op, {0, 0, 0, 0}});
  auto run_pass = [&](int lib) {
    if (!lib_runs(lib)) return;
    for (Row& r : rows) {
      const Case& cs = *r.cs;
      std::vector<float> inp(size_t(cs.n) * cs.c), w(size_t(cs.c) * cs.oc), out(size_t(cs.n) * cs.oc),
          dinp(size_t(cs.n) * cs.c), dw(size_t(cs.c) * cs.oc);
      fill(inp, 1), fill(w, 2), fill(out, 3);
      std::vector<uint16_t> inp16 = to_bf16(inp), w16 = to_bf16(w), out16 = to_bf16(out), dinp16(dinp.size());
      r.t[lib] = time_call([&] {
        if (lib == kEigen || lib == kOpenBLAS)
          (lib == kEigen ? eigen_op : blas_op)(r.op, r.outin, cs.n, cs.c, cs.oc, inp.data(), w.data(), out.data(),
                                               dinp.data(), dw.data());
        else if (lib == kOneDNN32)
          onednn_op(r.op, r.outin, cs.n, cs.c, cs.oc, onednn::Type::F32, inp.data(), w.data(), out.data(),
                    dinp.data(), dw.data());
        else
          onednn_op(r.op, r.outin, cs.n, cs.c, cs.oc, onednn::Type::BF16, inp16.data(), w16.data(), out16.data(),
                    dinp16.data(), dw.data());
      });
    }
  };
  run_pass(kEigen);
  run_pass(kOneDNN32);
  run_pass(kOneDNN16);
  trainer_kernels(cases);
  interference(0);
  double peaks[kLibs] = {};
  for (int l : {kEigen, kOneDNN32, kOneDNN16})
    if (lib_runs(l)) peaks[l] = peak(l);
  run_pass(kOpenBLAS);
  peaks[kOpenBLAS] = peak(kOpenBLAS);

  std::printf("\nGFLOP/s per library, and speed ratios to Eigen (time_Eigen / time_library; 0 = not run here)\n");
  std::printf("%-8s %5s %5s %5s %-6s %-5s %8s %8s %8s %8s %7s %7s %7s\n", "config", "N", "C", "OC", "layout", "op",
              "Eigen", "OpenBLAS", "dnn32", "dnn16", "OB/E", "dnn32/E", "dnn16/E");
  auto ratio = [](const Row& r, int l) { return r.t[l] > 0 ? r.t[kEigen] / r.t[l] : 0.0; };
  for (const Row& r : rows) {
    const double flops = 2.0 * r.cs->n * r.cs->c * r.cs->oc;
    auto rate = [&](int l) { return r.t[l] > 0 ? flops / r.t[l] * 1e-9 : 0.0; };
    std::printf("%-8s %5d %5d %5d %-6s %-5s %8.1f %8.1f %8.1f %8.1f %7.2f %7.2f %7.2f\n", r.cs->config, r.cs->n,
                r.cs->c, r.cs->oc, r.outin ? "OutIn" : "InOut", op_name(r.op), rate(kEigen), rate(kOpenBLAS),
                rate(kOneDNN32), rate(kOneDNN16), ratio(r, kOpenBLAS), ratio(r, kOneDNN32), ratio(r, kOneDNN16));
  }
  for (const char* c : {"A", "B", "default", "all"})
    for (int l : {kOpenBLAS, kOneDNN32, kOneDNN16}) {
      if (!lib_runs(l)) continue;
      double ls = 0;
      int n = 0;
      for (const Row& r : rows)
        if (std::string(c) == "all" || std::string(r.cs->config) == c) ls += std::log(ratio(r, l)), ++n;
      std::printf("geometric mean %s/Eigen speed ratio, config %s: %.2f\n", lib_name(l), c, std::exp(ls / n));
    }
  std::printf("\nthroughput at 2048^3 (%d threads):", threads);
  for (int l = 0; l < kLibs; ++l)
    if (peaks[l] > 0) std::printf(" %s %.1f GFLOP/s;", lib_name(l), peaks[l]);
  std::printf("\n");

  interference(1);
  return 0;
}
