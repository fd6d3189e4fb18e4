// bench_matmul: chooses the CPU matmul backend by measurement. For every matmul shape of the three reference
// configs (A, B, default) it times the forward product and the two backward products, in both weight layouts,
// with Eigen 3.4 (OpenMP-parallel GEMM) and with OpenBLAS (cblas_sgemm), and prints GFLOP/s and the ratio
// OpenBLAS/Eigen. It then measures the peak sgemm throughput at 2048^3 and checks whether an OpenMP kernel
// followed by an OpenBLAS GEMM (the trainer's pattern) costs more than the two run separately (thread pools
// fighting). Finally it times the trainer's own kernels::matmul_forward/backward at the same shapes.
//
//   build-kernels/bench/bench_matmul [threads=2] [seconds_per_case=0.15]
#include <cblas.h>
#include <omp.h>

#include <Eigen/Core>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_args.h"
#include "bench_timing.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/matmul.h"

namespace {

using Clock = std::chrono::steady_clock;
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Map = Eigen::Map<RowMat>;

double g_seconds = 0.15;

double time_call(const std::function<void()>& f) { return mt::bench::time_best(f, g_seconds); }

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

// An OpenMP elementwise kernel of the size of an MLP activation, like GELU or a residual add in the trainer.
void omp_elementwise(float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] = a[i] * 0.999f + b[i];
}

// Peak sgemm throughput (GFLOP/s) at 2048^3 with backend 0 = Eigen, 1 = OpenBLAS.
double peak(int backend) {
  const int S = 2048;
  std::vector<float> a(size_t(S) * S), b(size_t(S) * S), c(size_t(S) * S);
  fill(a, 4), fill(b, 5);
  double saved = g_seconds;
  g_seconds = 1.5;
  double t = time_call([&] {
    if (backend == 1)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, S, S, S, 1.f, a.data(), S, b.data(), S, 0.f, c.data(), S);
    else
      Map(c.data(), S, S).noalias() = Map(a.data(), S, S) * Map(b.data(), S, S);
  });
  g_seconds = saved;
  return 2.0 * S * S * S / t * 1e-9;
}

// The trainer's kernels::matmul_forward/backward (bias included) at config B's shapes, both layouts.
void trainer_kernels(const std::vector<Case>& cases) {
  std::printf("\nmt::kernels::matmul (bias included), config B shapes:\n");
  for (int k = 5; k < 10; ++k) {
    const Case& cs = cases[k];
    for (int outin = 0; outin < 2; ++outin) {
      auto layout = outin ? mt::kernels::WeightLayout::OutIn : mt::kernels::WeightLayout::InOut;
      using mt::Tensor;
      using mt::DType;
      Tensor inp = Tensor::empty({cs.n, cs.c}, DType::F32), out = Tensor::empty({cs.n, cs.oc}, DType::F32);
      Tensor w = outin ? Tensor::empty({cs.oc, cs.c}, DType::F32) : Tensor::empty({cs.c, cs.oc}, DType::F32);
      Tensor dw = Tensor::empty(w.shape(), DType::F32), bias = Tensor::empty({cs.oc}, DType::F32);
      Tensor dbias = Tensor::empty({cs.oc}, DType::F32), dinp = Tensor::empty({cs.n, cs.c}, DType::F32);
      double flops = 2.0 * cs.n * cs.c * cs.oc;
      double tf = time_call([&] { mt::kernels::matmul_forward(out, inp, w, bias, layout); });
      double tbw = time_call([&] { mt::kernels::matmul_backward(dinp, dw, dbias, out, inp, w, layout); });
      std::printf("  N=%d C=%d OC=%d %-5s forward %.1f GFLOP/s, backward %.1f GFLOP/s\n", cs.n, cs.c, cs.oc,
                  outin ? "OutIn" : "InOut", flops / tf * 1e-9, 2 * flops / tbw * 1e-9);
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
  mt::set_compute_threads(threads);
  openblas_set_num_threads(threads);
  if (peak_only) {  // the machine's sgemm throughput with the trainer's backend, for other benchmarks to quote
    std::printf("peak sgemm (Eigen, 2048^3, %d threads): %.1f GFLOP/s\n", threads, peak(0));
    return 0;
  }
  std::printf("bench_matmul: threads=%d (omp %d, openblas %d, eigen %d), %s\n", threads, omp_get_max_threads(),
              openblas_get_num_threads(), Eigen::nbThreads(), openblas_get_config());

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
    double t[2];
  };
  std::vector<Row> rows;
  for (const Case& cs : cases)
    for (int outin = 0; outin < 2; ++outin)
      for (Op op : {Op::Fwd, Op::BwdInp, Op::BwdW}) rows.push_back({&cs, outin, op, {0, 0}});
  auto run_pass = [&](int backend) {
    for (Row& r : rows) {
      const Case& cs = *r.cs;
      std::vector<float> inp(size_t(cs.n) * cs.c), w(size_t(cs.c) * cs.oc), out(size_t(cs.n) * cs.oc),
          dinp(size_t(cs.n) * cs.c), dw(size_t(cs.c) * cs.oc);
      fill(inp, 1), fill(w, 2), fill(out, 3);
      r.t[backend] = time_call([&] {
        (backend == 0 ? eigen_op : blas_op)(r.op, r.outin, cs.n, cs.c, cs.oc, inp.data(), w.data(), out.data(),
                                            dinp.data(), dw.data());
      });
    }
  };
  run_pass(0);
  trainer_kernels(cases);
  interference(0);
  double peak_eigen = peak(0);
  run_pass(1);
  double peak_blas = peak(1);

  std::printf("\n%-8s %5s %5s %5s %-6s %-5s %10s %10s %8s\n", "config", "N", "C", "OC", "layout", "op",
              "Eigen", "OpenBLAS", "OB/Eigen");
  double log_sum = 0;
  for (const Row& r : rows) {
    const double flops = 2.0 * r.cs->n * r.cs->c * r.cs->oc;
    std::printf("%-8s %5d %5d %5d %-6s %-5s %10.1f %10.1f %8.2f\n", r.cs->config, r.cs->n, r.cs->c, r.cs->oc,
                r.outin ? "OutIn" : "InOut", op_name(r.op), flops / r.t[0] * 1e-9, flops / r.t[1] * 1e-9,
                r.t[0] / r.t[1]);
    log_sum += std::log(r.t[0] / r.t[1]);
  }
  for (const char* c : {"A", "B", "default"}) {
    double ls = 0;
    int n = 0;
    for (const Row& r : rows)
      if (std::string(r.cs->config) == c) ls += std::log(r.t[0] / r.t[1]), ++n;
    std::printf("geometric mean OpenBLAS/Eigen speed ratio, config %s: %.2f\n", c, std::exp(ls / n));
  }
  std::printf("geometric mean OpenBLAS/Eigen speed ratio over all %zu cases: %.2f\n", rows.size(),
              std::exp(log_sum / rows.size()));
  std::printf("\nmeasured sgemm throughput (2048^3, %d threads): Eigen %.1f GFLOP/s, OpenBLAS %.1f GFLOP/s\n",
              threads, peak_eigen, peak_blas);

  interference(1);
  return 0;
}
