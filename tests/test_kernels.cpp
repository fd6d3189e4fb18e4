// Tests of the CPU kernels: finite-difference gradient checks in fp64 for every op (analytic gradient of a random
// projection L = sum(w * out) against central differences), fp32-vs-fp64 forward agreement, the = / += semantics
// of every output, and the special contracts (vocab padding, causality, repeated token ids, PyTorch's AdamW and
// clip_grad_norm_ rules).
#include <catch2/catch.hpp>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <functional>
#include <map>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/adamw.h"
#include "kernels/sgd.h"
#include "kernels/attention.h"
#include "kernels/crossentropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/cpu/matmul_backend.h"
#include "kernels/cpu/onednn_gemm.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"
#include "test_support.h"

using namespace mt;
using namespace mt::kernels;

namespace {

Tensor f64(Shape s) { return Tensor::empty(s, DType::F64); }
Tensor f32(Shape s) { return Tensor::empty(s, DType::F32); }

void fill_normal(const Tensor& t, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  double* p = t.data_as<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = shift + scale * nd(rng);
}

Tensor to32(const Tensor& t) {
  Tensor r = Tensor::empty(t.shape(), DType::F32);
  copy_convert(r, t);
  return r;
}
Tensor to64(const Tensor& t) {
  Tensor r = Tensor::empty(t.shape(), DType::F64);
  copy_convert(r, t);
  return r;
}
Tensor clone(const Tensor& t) {
  Tensor r = Tensor::empty(t.shape(), t.dtype());
  copy_convert(r, t);
  return r;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.data_as<double>()[i] * b.data_as<double>()[i];
  return s;
}

// Largest |a - b| / (atol + rtol * |b|) over the elements: <= 1 means they agree.
double max_err(const Tensor& a, const Tensor& b, double rtol, double atol) {
  Tensor a64 = a.dtype() == DType::F64 ? a : to64(a), b64 = b.dtype() == DType::F64 ? b : to64(b);
  REQUIRE(a.numel() == b.numel());
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = a64.data_as<double>()[i], y = b64.data_as<double>()[i];
    worst = std::max(worst, std::abs(x - y) / (atol + rtol * std::abs(y)));
  }
  return worst;
}

using Param = mt::test::GradParam;
using mt::test::gradcheck;

}  // namespace

TEST_CASE("threads: defaults and setting", "[threads]") {
  const char* env = std::getenv("OMP_NUM_THREADS");
  const std::string saved = env ? env : "";
  unsetenv("OMP_NUM_THREADS");
  REQUIRE(default_compute_threads(1) >= 1);
  REQUIRE(default_compute_threads(1000) == 1);
  setenv("OMP_NUM_THREADS", "3", 1);  // an explicit setting wins over the per-node split
  REQUIRE(default_compute_threads(1000) == 3);
  if (env) setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  else unsetenv("OMP_NUM_THREADS");
  set_compute_threads(2);
  REQUIRE(compute_threads() == 2);
}

TEST_CASE("matmul: gradients, semantics, fp32", "[matmul]") {
  const int64_t N = 6, C = 5, OC = 7;
  for (WeightLayout layout : {WeightLayout::InOut, WeightLayout::OutIn}) {
    for (bool with_bias : {true, false}) {
      INFO((layout == WeightLayout::InOut ? "InOut" : "OutIn") << (with_bias ? " with bias" : " no bias"));
      Shape ws = layout == WeightLayout::InOut ? Shape{C, OC} : Shape{OC, C};
      Tensor inp = f64({2, 3, C}), w = f64(ws), bias = with_bias ? f64({OC}) : Tensor();
      fill_normal(inp, 1), fill_normal(w, 2);
      if (with_bias) fill_normal(bias, 3);
      Tensor out = f64({2, 3, OC}), proj = f64({2, 3, OC});
      fill_normal(proj, 4);
      auto loss = [&] {
        matmul_forward(out, inp, w, bias, layout);
        return dot(out, proj);
      };
      // Reference forward by hand.
      loss();
      for (int64_t n = 0; n < N; ++n)
        for (int64_t o = 0; o < OC; ++o) {
          double s = with_bias ? bias.data_as<double>()[o] : 0.0;
          for (int64_t c = 0; c < C; ++c)
            s += inp.data_as<double>()[n * C + c] *
                 (layout == WeightLayout::InOut ? w.data_as<double>()[c * OC + o] : w.data_as<double>()[o * C + c]);
          REQUIRE(std::abs(out.data_as<double>()[n * OC + o] - s) <= 1e-12 * (1 + std::abs(s)));
        }
      // dinp is overwritten (preset garbage must vanish); dweight and dbias accumulate onto preset values.
      Tensor dinp = f64({2, 3, C}), dw = f64(ws), db = f64({OC});
      fill_normal(dinp, 5, 100.0);
      Tensor dw0 = f64(ws), db0 = f64({OC});
      fill_normal(dw0, 6), fill_normal(db0, 7);
      copy_convert(dw, dw0), copy_convert(db, db0);
      matmul_backward(dinp, dw, with_bias ? db : Tensor(), proj, inp, w, layout);
      Tensor gw = f64(ws), gb = f64({OC});
      for (int64_t i = 0; i < gw.numel(); ++i) gw.data_as<double>()[i] = dw.data_as<double>()[i] - dw0.data_as<double>()[i];
      for (int64_t i = 0; i < OC; ++i) gb.data_as<double>()[i] = db.data_as<double>()[i] - db0.data_as<double>()[i];
      std::vector<Param> params{{"inp", inp, dinp}, {"weight", w, gw}};
      if (with_bias) params.push_back({"bias", bias, gb});
      gradcheck(loss, params);
      if (!with_bias) REQUIRE(max_err(db, db0, 0, 1e-300) == 0);  // undefined dbias: untouched

      // Calling backward a second time adds the same gradient again (accumulation), and dinp stays the same.
      Tensor dinp1 = clone(dinp);
      matmul_backward(dinp, dw, Tensor(), proj, inp, w, layout);
      REQUIRE(max_err(dinp, dinp1, 1e-14, 1e-14) <= 1);
      for (int64_t i = 0; i < gw.numel(); ++i) gw.data_as<double>()[i] = dw0.data_as<double>()[i] + 2 * gw.data_as<double>()[i];
      REQUIRE(max_err(dw, gw, 1e-12, 1e-12) <= 1);

      // fp32 forward agrees with fp64: K = 5 products of O(1) terms, each rounded at 6e-8 relative.
      Tensor out32 = f32({2, 3, OC});
      matmul_forward(out32, to32(inp), to32(w), with_bias ? to32(bias) : Tensor(), layout);
      REQUIRE(max_err(out32, out, 1e-5, 1e-5) <= 1);
    }
  }
}

TEST_CASE("matmul: large shapes agree with a naive product (multithreaded GEMM path)", "[matmul]") {
  const int64_t N = 67, C = 129, OC = 65;
  Tensor inp = f64({N, C}), w = f64({OC, C}), b = f64({OC}), out = f64({N, OC});
  fill_normal(inp, 1), fill_normal(w, 2), fill_normal(b, 3);
  matmul_forward(out, inp, w, b, WeightLayout::OutIn);
  double worst = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double s = b.data_as<double>()[o];
      for (int64_t c = 0; c < C; ++c) s += inp.data_as<double>()[n * C + c] * w.data_as<double>()[o * C + c];
      worst = std::max(worst, std::abs(s - out.data_as<double>()[n * OC + o]));
    }
  REQUIRE(worst < 1e-11);  // 129-term sums of O(1) products in fp64
}

// auto's choices follow its documented rule, and the reason the trainer logs when bf16 widens to fp32 describes the
// same CPU.
TEST_CASE("cpu_matmul: auto's libraries, and the logged reason bf16 widens", "[matmul]") {
  namespace cpu = kernels::cpu;
  std::string error;
  cpu::MatmulBackends b;
  REQUIRE(cpu::resolve_matmul_backends(cpu::CpuMatmul::Eigen, b, error));
  CHECK(b.bf16 == cpu::MatmulLibrary::Eigen);
  CHECK(cpu::bf16_widening_reason(cpu::CpuMatmul::Eigen) == "train.cpu_matmul=eigen");
  REQUIRE(cpu::resolve_matmul_backends(cpu::CpuMatmul::Auto, b, error));
  CHECK((b.fp32 == cpu::MatmulLibrary::OneDNN) == cpu::onednn::has_avx2());  // faster than Eigen from AVX2 on
  const std::string why = cpu::bf16_widening_reason(cpu::CpuMatmul::Auto);
  INFO("oneDNN ISA " << cpu::onednn::isa_name() << "; reason: " << why);
  if (b.bf16 == cpu::MatmulLibrary::OneDNN) {
    CHECK(cpu::onednn::has_bf16_dot());
  } else if (!cpu::onednn::available()) {
    CHECK(why == "this build has no oneDNN");
  } else if (cpu::onednn::has_bf16_dot()) {  // bf16 dot products left unused: only Intel's half-rate AVX512-BF16
    CHECK_FALSE(cpu::onednn::has_amx());
    CHECK((why.find("but no AMX") != std::string::npos));
  } else {
    CHECK((why.find("AVX-512") != std::string::npos || why.find("no bf16 dot product") != std::string::npos));
  }
}

// Every CPU matmul library against fp64, with the bound any fp32-accumulating product meets whatever its summation
// order (Higham's gamma_k = k u / (1 - k u) times the sum of the terms' magnitudes, u = 2^-24), plus one rounding to
// the output's dtype. The operands are rounded to the tested dtype first and the reference reads those values, so
// the bound is exact, not a tolerance: a lost or doubled term, a wrong transpose or a missed accumulation breaks it.
TEST_CASE("matmul: every CPU library against fp64 at odd, tiny and blocked shapes", "[matmul]") {
  using kernels::cpu::MatmulLibrary;
  namespace onednn = kernels::cpu::onednn;
  using kernels::cpu::MatmulBackends;
  struct Lib {
    MatmulBackends backends;  // fp32's and bf16's libraries
    DType dtype;
    const char* name;
  };
  const MatmulLibrary E = MatmulLibrary::Eigen, D = MatmulLibrary::OneDNN;
  std::vector<Lib> libs{{{E, E}, DType::F32, "Eigen fp32"},
                        {{E, E}, DType::BF16, "bf16 widened onto Eigen"},
                        {{E, E}, DType::F16, "fp16 widened onto Eigen"}};
  if (onednn::available()) {  // the widened 16-bit paths run fp32's library
    libs.push_back({{D, D}, DType::F32, "oneDNN fp32"});
    libs.push_back({{D, E}, DType::BF16, "bf16 widened onto oneDNN fp32"});
    libs.push_back({{D, E}, DType::F16, "fp16 widened onto oneDNN fp32"});
  } else {
    WARN("oneDNN not checked: built without it");
  }
  if (onednn::has_avx512()) libs.push_back({{D, D}, DType::BF16, "oneDNN bf16"});
  else WARN("oneDNN bf16 not checked: it needs AVX-512");
  const double u = std::ldexp(1.0, -24);
  auto gamma = [&](int64_t k) { return k * u / (1 - k * u); };
  auto rounded_to = [](const Tensor& t64, DType d) {  // t64's values rounded to d, and those values in fp64
    Tensor r = Tensor::empty(t64.shape(), d);
    copy_convert(r, t64);
    return std::make_pair(r, to64(r));
  };
  // {N, C, OC}. oneDNN's fp32 on AVX2 reads some operands from padded copies (onednn_gemm.cpp): the weight
  // gradient's transposed operand with rows 4 KiB apart (the fifth shape InOut, the sixth OutIn), and a second operand
  // with rows a multiple of 1 KiB apart in a small product (the fifth OutIn, the sixth InOut, the last in both).
  const int64_t shapes[][3] = {{1, 1, 1},    {5, 3, 7},     {37, 72, 200}, {300, 200, 520},
                               {37, 1024, 5}, {6, 7, 1024}, {20, 256, 512}};
  // The fp64 products of the rounded inputs, each sum beside its sum of absolute terms (the bound's), computed once
  // per input dtype, shape and layout: the libraries of one dtype and both bias cases share them (under the
  // sanitizers these loops were most of the test's 29 s).
  struct Reference {
    std::vector<double> out, out_abs, dinp, dinp_abs, dw, dw_abs;  // out without the bias; dw onto dw_before
  };
  std::map<std::tuple<DType, int64_t, int64_t, int64_t, bool>, Reference> references;
  for (const Lib& lib : libs) {
    kernels::cpu::UsingMatmulBackends use(lib.backends);
    // The 16-bit outputs' one rounding (unit roundoff 2^-8 for bf16, 2^-11 for fp16); fp32's is inside gamma.
    const double u_out = lib.dtype == DType::BF16 ? std::ldexp(1.0, -8)
                         : lib.dtype == DType::F16 ? std::ldexp(1.0, -11) : 0.0;
    for (const auto& sh : shapes)
      for (WeightLayout layout : {WeightLayout::InOut, WeightLayout::OutIn})
        for (bool with_bias : {true, false}) {
          const int64_t N = sh[0], C = sh[1], OC = sh[2];
          const bool inout = layout == WeightLayout::InOut;
          INFO(lib.name << " N " << N << " C " << C << " OC " << OC << (inout ? " InOut" : " OutIn")
                        << (with_bias ? " bias" : ""));
          const Shape ws = inout ? Shape{C, OC} : Shape{OC, C};
          Tensor a0 = f64({N, C}), w0 = f64(ws), b0 = f64({OC}), g0 = f64({N, OC});
          fill_normal(a0, 1), fill_normal(w0, 2), fill_normal(b0, 3), fill_normal(g0, 4);
          auto [a, a64] = rounded_to(a0, lib.dtype);
          auto [w, w64] = rounded_to(w0, lib.dtype);
          auto [b, b64] = rounded_to(b0, lib.dtype);
          auto [g, g64] = rounded_to(g0, lib.dtype);  // dout
          const double *A = a64.data_as<double>(), *W = w64.data_as<double>(), *B = b64.data_as<double>(),
                       *G = g64.data_as<double>();
          auto wt = [&](int64_t c, int64_t o) { return inout ? W[c * OC + o] : W[o * C + c]; };
          // dinp (=, over preset garbage), dweight and dbias (+= onto preset fp32 values).
          Tensor dinp = Tensor::empty({N, C}, lib.dtype), dw = to32(w0), db = to32(b0);
          copy_convert(dinp, a0);
          Tensor dw_before = to64(dw), db_before = to64(db);
          Reference& r = references[{lib.dtype, N, C, OC, inout}];
          if (r.out.empty()) {
            r.out.resize(N * OC), r.out_abs.resize(N * OC), r.dinp.resize(N * C), r.dinp_abs.resize(N * C);
            r.dw.resize(C * OC), r.dw_abs.resize(C * OC);
            for (int64_t n = 0; n < N; ++n)
              for (int64_t o = 0; o < OC; ++o) {
                double s = 0, m = 0;
                for (int64_t c = 0; c < C; ++c) s += A[n * C + c] * wt(c, o), m += std::abs(A[n * C + c] * wt(c, o));
                r.out[n * OC + o] = s, r.out_abs[n * OC + o] = m;
              }
            for (int64_t n = 0; n < N; ++n)
              for (int64_t c = 0; c < C; ++c) {
                double s = 0, m = 0;
                for (int64_t o = 0; o < OC; ++o) s += G[n * OC + o] * wt(c, o), m += std::abs(G[n * OC + o] * wt(c, o));
                r.dinp[n * C + c] = s, r.dinp_abs[n * C + c] = m;
              }
            for (int64_t c = 0; c < C; ++c)
              for (int64_t o = 0; o < OC; ++o) {
                const int64_t i = inout ? c * OC + o : o * C + c;
                double s = dw_before.data_as<double>()[i], m = std::abs(s);
                for (int64_t n = 0; n < N; ++n)
                  s += A[n * C + c] * G[n * OC + o], m += std::abs(A[n * C + c] * G[n * OC + o]);
                r.dw[i] = s, r.dw_abs[i] = m;
              }
          }
          // Largest |got - ref| / bound over the elements: <= 1 means within it.
          auto worst = [](const Tensor& got, const std::vector<double>& ref, const std::vector<double>& bound) {
            Tensor g = to64(got);
            double r = 0;
            for (size_t i = 0; i < ref.size(); ++i)
              r = std::max(r, std::abs(g.data_as<double>()[i] - ref[i]) / (bound[i] + 1e-300));
            return r;
          };

          Tensor out = Tensor::empty({N, OC}, lib.dtype);
          matmul_forward(out, a, w, with_bias ? b : Tensor(), layout);
          std::vector<double> ref(N * OC), bound(N * OC);
          for (int64_t n = 0; n < N; ++n)
            for (int64_t o = 0; o < OC; ++o) {
              const int64_t i = n * OC + o;
              const double s = (with_bias ? B[o] : 0) + r.out[i], m = (with_bias ? std::abs(B[o]) : 0) + r.out_abs[i];
              ref[i] = s, bound[i] = gamma(C + 1) * m + u_out * (std::abs(s) + gamma(C + 1) * m);
            }
          CHECK(worst(out, ref, bound) <= 1);

          matmul_backward(dinp, dw, with_bias ? db : Tensor(), g, a, w, layout);
          std::vector<double> bi(N * C);
          for (size_t i = 0; i < bi.size(); ++i)
            bi[i] = gamma(OC) * r.dinp_abs[i] + u_out * (std::abs(r.dinp[i]) + gamma(OC) * r.dinp_abs[i]);
          CHECK(worst(dinp, r.dinp, bi) <= 1);
          std::vector<double> bw(C * OC);
          for (size_t i = 0; i < bw.size(); ++i) bw[i] = gamma(N + 1) * r.dw_abs[i];
          CHECK(worst(dw, r.dw, bw) <= 1);
          std::vector<double> rb(OC), bb(OC);
          for (int64_t o = 0; o < OC; ++o) {
            double s = db_before.data_as<double>()[o], m = std::abs(s);
            if (with_bias)
              for (int64_t n = 0; n < N; ++n) s += G[n * OC + o], m += std::abs(G[n * OC + o]);
            rb[o] = s, bb[o] = with_bias ? gamma(N + 1) * m : 0.0;  // none: untouched, bit for bit
          }
          CHECK(worst(db, rb, bb) <= 1);
        }
  }
}

TEST_CASE("layernorm: gradients, accumulation, fp32", "[layernorm]") {
  const int64_t B = 2, T = 3, C = 7;
  Tensor inp = f64({B, T, C}), w = f64({C}), b = f64({C}), out = f64({B, T, C}), mean = f64({B * T}),
         rstd = f64({B * T}), proj = f64({B, T, C});
  fill_normal(inp, 1, 2.0, 0.5), fill_normal(w, 2), fill_normal(b, 3), fill_normal(proj, 4);
  auto loss = [&] {
    layernorm_forward(out, mean, rstd, inp, w, b);
    return dot(out, proj);
  };
  loss();
  // Forward: each output row has mean(out - b)/w ~ 0 and unit variance (up to eps).
  for (int64_t n = 0; n < B * T; ++n) {
    double s = 0, s2 = 0;
    for (int64_t c = 0; c < C; ++c) {
      double xh = (out.data_as<double>()[n * C + c] - b.data_as<double>()[c]) / w.data_as<double>()[c];
      s += xh, s2 += xh * xh;
    }
    REQUIRE(std::abs(s / C) < 1e-12);
    REQUIRE(std::abs(s2 / C - 1) < 1e-4);  // var / (var + 1e-5) with var ~ 4
  }
  // All three gradients accumulate: preset them and subtract afterwards.
  Tensor dinp = f64({B, T, C}), dw = f64({C}), db = f64({C});
  Tensor dinp0 = f64({B, T, C}), dw0 = f64({C}), db0 = f64({C});
  fill_normal(dinp0, 5), fill_normal(dw0, 6), fill_normal(db0, 7);
  copy_convert(dinp, dinp0), copy_convert(dw, dw0), copy_convert(db, db0);
  layernorm_backward(dinp, dw, db, proj, inp, w, mean, rstd);
  Tensor gi = f64({B, T, C}), gw = f64({C}), gb = f64({C});
  auto diff = [](const Tensor& r, const Tensor& a, const Tensor& a0) {
    for (int64_t i = 0; i < r.numel(); ++i) r.data_as<double>()[i] = a.data_as<double>()[i] - a0.data_as<double>()[i];
  };
  diff(gi, dinp, dinp0), diff(gw, dw, dw0), diff(gb, db, db0);
  gradcheck(loss, {{"inp", inp, gi}, {"weight", w, gw}, {"bias", b, gb}});

  // fp32 forward: normalisation of C = 7 values, a handful of roundings at 6e-8 each, scaled by |w| ~ 1.
  Tensor out32 = f32({B, T, C}), m32 = f32({B * T}), r32 = f32({B * T});
  layernorm_forward(out32, m32, r32, to32(inp), to32(w), to32(b));
  REQUIRE(max_err(out32, out, 1e-5, 1e-5) <= 1);
  REQUIRE(max_err(r32, rstd, 1e-5, 0) <= 1);
}

TEST_CASE("layernorm: many rows (multithreaded) match fp64 in fp32", "[layernorm]") {
  const int64_t N = 300, C = 130;  // N*C above the parallel grain; C not a multiple of the vector width
  Tensor inp = f64({N, C}), w = f64({C}), b = f64({C}), out = f64({N, C}), m = f64({N}), r = f64({N});
  fill_normal(inp, 1), fill_normal(w, 2), fill_normal(b, 3);
  layernorm_forward(out, m, r, inp, w, b);
  Tensor o32 = f32({N, C}), m32 = f32({N}), r32 = f32({N});
  layernorm_forward(o32, m32, r32, to32(inp), to32(w), to32(b));
  REQUIRE(max_err(o32, out, 1e-5, 1e-5) <= 1);  // 130-term fp32 sums: ~1e-6 relative
  Tensor d = f64({N, C}), dw = f64({C}), db = f64({C}), g = f64({N, C});
  fill_normal(g, 4);
  layernorm_backward(d, dw, db, g, inp, w, m, r);
  Tensor d32 = f32({N, C}), dw32 = f32({C}), db32 = f32({C});
  layernorm_backward(d32, dw32, db32, to32(g), to32(inp), to32(w), m32, r32);
  REQUIRE(max_err(d32, d, 1e-4, 1e-4) <= 1);
  REQUIRE(max_err(dw32, dw, 1e-4, 1e-4) <= 1);  // 300-term sums of O(1) values
  REQUIRE(max_err(db32, db, 1e-4, 1e-4) <= 1);
}

TEST_CASE("gelu: gradient, aliasing, fp32", "[gelu]") {
  Tensor inp = f64({5, 7}), out = f64({5, 7}), proj = f64({5, 7}), dinp = f64({5, 7});
  fill_normal(inp, 1, 2.0), fill_normal(proj, 2);
  auto loss = [&] {
    gelu_forward(out, inp);
    return dot(out, proj);
  };
  loss();
  for (int64_t i = 0; i < inp.numel(); ++i) {
    double x = inp.data_as<double>()[i];
    double ref = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    REQUIRE(std::abs(out.data_as<double>()[i] - ref) < 1e-14);
  }
  fill_normal(dinp, 3, 100.0);  // overwritten
  gelu_backward(dinp, inp, proj);
  gradcheck(loss, {{"inp", inp, dinp}});
  Tensor d2 = clone(proj);  // dinp aliasing dout
  gelu_backward(d2, inp, d2);
  REQUIRE(max_err(d2, dinp, 1e-15, 1e-15) <= 1);
  // fp32 (Eigen's vectorised tanh, a few ulp) on a long tensor to cover the multithreaded, vector path.
  Tensor big = f64({70000}), bo = f64({70000}), bd = f64({70000}), bg = f64({70000});
  fill_normal(big, 4, 3.0), fill_normal(bg, 5);
  gelu_forward(bo, big);
  gelu_backward(bd, big, bg);
  Tensor bo32 = f32({70000}), bd32 = f32({70000});
  gelu_forward(bo32, to32(big));
  gelu_backward(bd32, to32(big), to32(bg));
  REQUIRE(max_err(bo32, bo, 1e-5, 1e-6) <= 1);
  // The derivative needs sech^2(u) = 1 - t^2, which cancels completely in fp32 where t rounds to 1 (|u| > ~8,
  // |x| ~ 4.5): there the true value (~1e-6, times the factor x u'(x) ~ 10) is lost, an absolute error up to
  // ~2e-5. PyTorch's fp32 GELU backward has the same cancellation.
  REQUIRE(max_err(bd32, bd, 1e-5, 3e-5) <= 1);
}

TEST_CASE("attention: gradient, causality, probabilities", "[attention]") {
  const int64_t B = 2, T = 5, NH = 2, C = 6;  // HS = 3
  Tensor qkv = f64({B, T, 3 * C}), out = f64({B, T, C}), att = f64({B, NH, T, T}), proj = f64({B, T, C});
  fill_normal(qkv, 1), fill_normal(proj, 2);
  auto loss = [&] {
    attention_forward(out, att, qkv, NH);
    return dot(out, proj);
  };
  loss();
  // Probabilities: rows sum to 1, exact zeros above the diagonal.
  for (int64_t r = 0; r < B * NH * T; ++r) {
    const int64_t i = r % T;
    double s = 0;
    for (int64_t j = 0; j < T; ++j) {
      double p = att.data_as<double>()[r * T + j];
      if (j > i) REQUIRE(p == 0.0);
      s += p;
    }
    REQUIRE(std::abs(s - 1) < 1e-14);
  }
  // A naive reference for one (b, h, i).
  {
    const int64_t b = 1, h = 1, i = 3, HS = C / NH;
    const double* q = qkv.data_as<double>();
    std::vector<double> s(i + 1);
    double mx = -1e300, z = 0;
    for (int64_t j = 0; j <= i; ++j) {
      double d = 0;
      for (int64_t k = 0; k < HS; ++k) d += q[(b * T + i) * 3 * C + h * HS + k] * q[(b * T + j) * 3 * C + C + h * HS + k];
      s[j] = d / std::sqrt(double(HS));
      mx = std::max(mx, s[j]);
    }
    for (auto& x : s) z += (x = std::exp(x - mx));
    for (int64_t k = 0; k < HS; ++k) {
      double o = 0;
      for (int64_t j = 0; j <= i; ++j) o += s[j] / z * q[(b * T + j) * 3 * C + 2 * C + h * HS + k];
      REQUIRE(std::abs(o - out.data_as<double>()[(b * T + i) * C + h * HS + k]) < 1e-14);
    }
  }
  Tensor dqkv = f64({B, T, 3 * C}), datt = f64({B, NH, T, T});
  fill_normal(dqkv, 3, 100.0), fill_normal(datt, 4, 100.0);  // dqkv overwritten, datt scratch
  attention_backward(dqkv, datt, proj, qkv, out, att, NH);
  gradcheck(loss, {{"qkv", qkv, dqkv}});

  // Causality: perturbing q, k, v of the last position leaves every earlier output bit-identical.
  Tensor out0 = clone(out);
  for (int64_t c = 0; c < 3 * C; ++c)
    for (int64_t b = 0; b < B; ++b) qkv.data_as<double>()[(b * T + T - 1) * 3 * C + c] += 0.7;
  attention_forward(out, att, qkv, NH);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t i = (b * T + t) * C + c;
        if (t < T - 1)
          REQUIRE(out.data_as<double>()[i] == out0.data_as<double>()[i]);
        else
          REQUIRE(out.data_as<double>()[i] != out0.data_as<double>()[i]);
      }
}

TEST_CASE("attention: fp32 agrees with fp64 at a model-like size and at sizes off the register tiles",
          "[attention]") {
  // fp32 runs on register tiles of 8 rows by one or two vectors (16 floats each with AVX-512); these sizes leave
  // partial row tiles, head sizes that are not whole vectors, and a one-token sequence.
  const std::vector<std::array<int64_t, 4>> sizes = {{3, 33, 4, 64}, {2, 17, 2, 48}, {1, 9, 3, 9}, {2, 1, 2, 6}};
  for (const auto& [B, T, NH, C] : sizes) {
    CAPTURE(B, T, NH, C);
    Tensor qkv = f64({B, T, 3 * C}), out = f64({B, T, C}), att = f64({B, NH, T, T}), g = f64({B, T, C});
    fill_normal(qkv, 1), fill_normal(g, 2);
    attention_forward(out, att, qkv, NH);
    Tensor dqkv = f64({B, T, 3 * C}), datt = f64({B, NH, T, T});
    attention_backward(dqkv, datt, g, qkv, out, att, NH);
    Tensor o32 = f32({B, T, C}), a32 = f32({B, NH, T, T}), d32 = f32({B, T, 3 * C}), da32 = f32({B, NH, T, T});
    Tensor q32 = to32(qkv);
    attention_forward(o32, a32, q32, NH);
    attention_backward(d32, da32, to32(g), q32, o32, a32, NH);
    // Scores are dot products of up to 24 O(1) terms (|s| ~ 5), exponentiated: ~1e-6 relative error in fp32.
    REQUIRE(max_err(o32, out, 1e-4, 1e-5) <= 1);
    REQUIRE(max_err(a32, att, 1e-4, 1e-6) <= 1);
    REQUIRE(max_err(d32, dqkv, 1e-4, 1e-4) <= 1);
  }
}

TEST_CASE("embedding: gradients with repeated token ids, accumulation", "[embedding]") {
  const int64_t B = 2, T = 5, C = 7, V = 6, maxT = 8;
  Tensor tokens = Tensor::empty({B, T}, DType::I32);
  const int32_t ids[B * T] = {3, 1, 3, 3, 0, 5, 1, 1, 3, 2};  // 3 appears 4 times, 1 three times, 4 never
  for (int i = 0; i < B * T; ++i) tokens.data_as<int32_t>()[i] = ids[i];
  Tensor wte = f64({V, C}), wpe = f64({maxT, C}), out = f64({B, T, C}), proj = f64({B, T, C});
  fill_normal(wte, 1), fill_normal(wpe, 2), fill_normal(proj, 3);
  auto loss = [&] {
    embedding_forward(out, tokens, wte, wpe);
    return dot(out, proj);
  };
  loss();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c)
        REQUIRE(out.data_as<double>()[(b * T + t) * C + c] ==
                wte.data_as<double>()[ids[b * T + t] * C + c] + wpe.data_as<double>()[t * C + c]);
  Tensor dwte = f64({V, C}), dwpe = f64({maxT, C});
  embedding_backward(dwte, dwpe, proj, tokens);
  gradcheck(loss, {{"wte", wte, dwte}, {"wpe", wpe, dwpe}});
  for (int64_t c = 0; c < C; ++c) REQUIRE(dwte.data_as<double>()[4 * C + c] == 0.0);
  // Accumulation: a second call doubles the gradients.
  Tensor dwte1 = clone(dwte);
  embedding_backward(dwte, dwpe, proj, tokens);
  for (int64_t i = 0; i < dwte.numel(); ++i)
    REQUIRE(dwte.data_as<double>()[i] == Approx(2 * dwte1.data_as<double>()[i]).margin(1e-15));
  // fp32 forward is an exact sum of fp32-rounded inputs: agree to fp32 rounding (6e-8 relative).
  Tensor o32 = f32({B, T, C});
  embedding_forward(o32, tokens, to32(wte), to32(wpe));
  REQUIRE(max_err(o32, out, 2e-7, 1e-7) <= 1);
}

TEST_CASE("embedding: vocabulary shards (v0) and no position table, as tensor parallelism uses them", "[embedding]") {
  // Two shards of a 6-row table (rows [0, 3) and [3, 6)): each adds only its own rows; the sum of the shards'
  // outputs plus the position rows is the full embedding, and each shard's gradient is its rows of the full one.
  const int64_t B = 2, T = 5, C = 7, V = 6, maxT = 8, R = 3;
  Tensor tokens = Tensor::empty({B, T}, DType::I32);
  const int32_t ids[B * T] = {3, 1, 3, 3, 0, 5, 1, 1, 3, 2};
  for (int i = 0; i < B * T; ++i) tokens.data_as<int32_t>()[i] = ids[i];
  Tensor wte = f64({V, C}), wpe = f64({maxT, C}), full = f64({B, T, C}), proj = f64({B, T, C});
  fill_normal(wte, 1), fill_normal(wpe, 2), fill_normal(proj, 3);
  embedding_forward(full, tokens, wte, wpe);
  Tensor dwte = f64({V, C}), dwpe = f64({maxT, C});
  zero_(dwte), zero_(dwpe);
  embedding_backward(dwte, dwpe, proj, tokens);
  Tensor sum = f64({B, T, C});
  zero_(sum);
  for (int part = 0; part < 2; ++part) {
    const int64_t v0 = part * R;
    Tensor shard = clone(wte.slice(v0 * C, {R, C})), out = f64({B, T, C});
    const Tensor none;
    auto loss = [&] {
      embedding_forward(out, tokens, shard, none, v0, V);
      return dot(out, proj);
    };
    loss();
    accumulate(sum, out);
    Tensor dshard = f64({R, C});
    zero_(dshard);
    embedding_backward(dshard, none, proj, tokens, v0, V);
    gradcheck(loss, {{"wte shard", shard, dshard}});
    REQUIRE(max_err(dshard, dwte.slice(v0 * C, {R, C}), 0, 1e-300) == 0);
    // With a position table the shard's dwpe is the full dwpe (every token's row of dout, owned or not).
    Tensor dwpe2 = f64({maxT, C});
    zero_(dwpe2), zero_(dshard);
    embedding_backward(dshard, dwpe2, proj, tokens, v0, V);
    REQUIRE(max_err(dwpe2, dwpe, 0, 1e-300) == 0);
  }
  for (int64_t b = 0; b < B; ++b) accumulate(sum.slice(b * T * C, {T * C}), wpe.slice(0, {T * C}));
  REQUIRE(max_err(sum, full, 1e-15, 1e-15) <= 1);
}

TEST_CASE("bias_add: semantics and gradient", "[elementwise]") {
  const int64_t N = 5, OC = 7;
  Tensor x = f64({N, OC}), bias = f64({OC}), w = f64({N, OC}), out = f64({N, OC});
  fill_normal(x, 1), fill_normal(bias, 2), fill_normal(w, 3);
  auto loss = [&] {
    copy_convert(out, x);
    bias_add(out, bias);
    return dot(out, w);
  };
  loss();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < OC; ++c)
      REQUIRE(out.data_as<double>()[n * OC + c] == x.data_as<double>()[n * OC + c] + bias.data_as<double>()[c]);
  // dL/dbias = sum_n w[n, :], dL/dx = w.
  Tensor dbias = f64({OC});
  for (int64_t c = 0; c < OC; ++c) {
    double s = 0;
    for (int64_t n = 0; n < N; ++n) s += w.data_as<double>()[n * OC + c];
    dbias.data_as<double>()[c] = s;
  }
  gradcheck(loss, {{"bias", bias, dbias}, {"x", x, w}});
  Tensor o32 = to32(x);
  bias_add(o32, to32(bias));
  loss();
  REQUIRE(max_err(o32, out, 2e-7, 1e-7) <= 1);
}

TEST_CASE("softmax_xent: gradient, padding, aliasing, fp32", "[crossentropy]") {
  const int64_t N = 6, V = 7, Vp = 10;  // 3 padding columns
  Tensor logits = f64({2, 3, Vp}), targets = Tensor::empty({2, 3}, DType::I32);
  fill_normal(logits, 1, 2.0);
  const int32_t tg[N] = {0, 6, 3, 3, 1, 5};
  for (int i = 0; i < N; ++i) targets.data_as<int32_t>()[i] = tg[i];
  const double dloss = 0.37;
  Tensor losses = f64({2, 3}), dlogits = f64({2, 3, Vp});
  auto loss = [&] {
    softmax_xent_forward_backward(losses, Tensor(), logits, targets, V, dloss);
    double s = 0;
    for (int64_t n = 0; n < N; ++n) s += dloss * losses.data_as<double>()[n];
    return s;
  };
  fill_normal(dlogits, 2, 100.0);  // overwritten, padding included
  softmax_xent_forward_backward(losses, dlogits, logits, targets, V, dloss);
  for (int64_t n = 0; n < N; ++n) {  // reference loss, real columns only
    const double* l = logits.data_as<double>() + n * Vp;
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(l[v]);
    REQUIRE(std::abs(losses.data_as<double>()[n] - (std::log(z) - l[tg[n]])) < 1e-13);
  }
  // The numeric gradient of the padding columns is 0 (they do not enter the loss); the analytic one must be too.
  gradcheck(loss, {{"logits", logits, dlogits}});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = V; v < Vp; ++v) REQUIRE(dlogits.data_as<double>()[n * Vp + v] == 0.0);

  // Huge padding logits change neither the loss nor the real gradients.
  Tensor logits2 = clone(logits), losses2 = f64({2, 3}), dlogits2 = f64({2, 3, Vp});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = V; v < Vp; ++v) logits2.data_as<double>()[n * Vp + v] = 1e3 * (v - V + 1);
  softmax_xent_forward_backward(losses2, dlogits2, logits2, targets, V, dloss);
  REQUIRE(max_err(losses2, losses, 0, 1e-300) == 0);
  REQUIRE(max_err(dlogits2, dlogits, 0, 1e-300) == 0);

  // dlogits aliasing logits gives the same result; fp32 losses with fp64 logits work too.
  Tensor inplace = clone(logits2), losses3 = f32({2, 3});
  softmax_xent_forward_backward(losses3, inplace, inplace, targets, V, dloss);
  REQUIRE(max_err(inplace, dlogits, 0, 1e-300) == 0);
  REQUIRE(max_err(losses3, losses, 1e-7, 1e-7) <= 1);

  // fp32: logsumexp over 7 values of magnitude ~4: a few roundings at 6e-8 relative.
  Tensor l32 = f32({2, 3}), d32 = f32({2, 3, Vp});
  softmax_xent_forward_backward(l32, d32, to32(logits), targets, V, dloss);
  REQUIRE(max_err(l32, losses, 1e-6, 1e-6) <= 1);
  REQUIRE(max_err(d32, dlogits, 1e-6, 1e-7) <= 1);
}

TEST_CASE("softmax_xent: many rows of a wide vocabulary (multithreaded) in fp32", "[crossentropy]") {
  const int64_t N = 40, V = 1000, Vp = 1024;
  Tensor logits = f64({N, Vp}), targets = Tensor::empty({N}, DType::I32), losses = f64({N}), d = f64({N, Vp});
  fill_normal(logits, 1, 3.0);
  for (int64_t n = 0; n < N; ++n) targets.data_as<int32_t>()[n] = int32_t((n * 37) % V);
  softmax_xent_forward_backward(losses, d, logits, targets, V, 1.0 / N);
  Tensor l32 = f32({N}), d32 = to32(logits);
  softmax_xent_forward_backward(l32, d32, d32, targets, V, 1.0 / N);
  REQUIRE(max_err(l32, losses, 1e-5, 1e-5) <= 1);  // 1000-term fp32 sums: ~1e-6 relative
  REQUIRE(max_err(d32, d, 1e-4, 1e-9) <= 1);
}

TEST_CASE("elementwise: divide_ is one fp32 division rounded once into the storage type", "[elementwise]") {
  const int64_t n = 1001;
  Tensor x32 = f32({n});
  for (int64_t i = 0; i < n; ++i) x32.data_as<float>()[i] = std::sin(0.1f * float(i)) * 100.0f;
  Tensor x16 = Tensor::empty({n}, DType::BF16);
  copy_convert(x16, x32);
  Tensor want16 = Tensor::empty({n}, DType::BF16), got = f32({n}), want = f32({n});
  for (int64_t i = 0; i < n; ++i) {
    want.data_as<float>()[i] = x32.data_as<float>()[i] / 3.0f;
    got.data_as<float>()[i] = bf16_to_float(static_cast<const uint16_t*>(x16.data())[i]) / 3.0f;
  }
  copy_convert(want16, got);  // the fp32 quotients of the bf16 inputs, rounded once
  divide_(x32, 3);
  divide_(x16, 3);
  REQUIRE(std::memcmp(x32.data(), want.data(), x32.nbytes()) == 0);
  REQUIRE(std::memcmp(x16.data(), want16.data(), x16.nbytes()) == 0);
}

TEST_CASE("elementwise: add (aliased too) and accumulate", "[elementwise]") {
  for (int64_t n : {int64_t(7), int64_t(100003)}) {  // tiny and multithreaded
    Tensor a = f64({n}), b = f64({n}), out = f64({n});
    fill_normal(a, 1), fill_normal(b, 2);
    add_forward(out, a, b);
    for (int64_t i = 0; i < n; ++i) REQUIRE(out.data_as<double>()[i] == a.data_as<double>()[i] + b.data_as<double>()[i]);
    // Gradient of L = sum(w * (a + b)) is w for both inputs; checked numerically on the small size.
    if (n == 7) {
      Tensor w = f64({n});
      fill_normal(w, 3);
      auto loss = [&] {
        add_forward(out, a, b);
        return dot(out, w);
      };
      gradcheck(loss, {{"a", a, w}, {"b", b, w}});
    }
    add_forward(out, a, b);  // the gradient check left `out` from a perturbed input
    Tensor a2 = clone(a);
    add_forward(a2, a2, b);  // out aliasing a
    REQUIRE(max_err(a2, out, 0, 1e-300) == 0);
    Tensor acc = clone(a);
    accumulate(acc, b);
    accumulate(acc, b);
    for (int64_t i = 0; i < n; ++i)
      REQUIRE(acc.data_as<double>()[i] == (a.data_as<double>()[i] + b.data_as<double>()[i]) + b.data_as<double>()[i]);
    Tensor o32 = f32({n});
    add_forward(o32, to32(a), to32(b));
    // Three fp32 roundings (a, b, the sum) of 6e-8 relative to |a| + |b| <= ~10: absolute 2e-6 at most.
    REQUIRE(max_err(o32, out, 0, 2e-6) <= 1);
  }
}

TEST_CASE("reduce: sum, sum of squares, clip_scale", "[reduce]") {
  for (int64_t n : {int64_t(5), int64_t(200001)}) {
    Tensor x = f32({n}), acc = f64({1}), acc32 = f32({1});
    // Integers: every partial sum is exact in double, so the result is exact whatever the split among threads.
    for (int64_t i = 0; i < n; ++i) x.data_as<float>()[i] = float(i % 7) - 3.0f;
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; ++i) s += double(i % 7) - 3, s2 += (double(i % 7) - 3) * (double(i % 7) - 3);
    acc.data_as<double>()[0] = 10.0;
    sum_accumulate(acc, x);
    REQUIRE(acc.data_as<double>()[0] == 10.0 + s);
    acc.data_as<double>()[0] = 1.5;
    sum_squares_accumulate(acc, x);
    REQUIRE(acc.data_as<double>()[0] == 1.5 + s2);
    sum_squares_accumulate(acc32, to64(x));
    REQUIRE(acc32.data_as<float>()[0] == float(s2));
  }
  Tensor scale = f32({1}), norm = f32({1}), nsq = f64({1});
  nsq.data_as<double>()[0] = 4.0;  // norm 2
  clip_scale(scale, norm, nsq, 1.0);
  REQUIRE(norm.data_as<float>()[0] == 2.0f);
  REQUIRE(scale.data_as<float>()[0] == float(1.0 / (2.0 + 1e-6)));
  clip_scale(scale, norm, nsq, 3.0);  // below the threshold: no clipping
  REQUIRE(scale.data_as<float>()[0] == 1.0f);
  clip_scale(scale, norm, nsq, 2.0);  // norm == max_norm: coef = 2/(2+1e-6) < 1, applied as PyTorch does
  REQUIRE(scale.data_as<float>()[0] == float(2.0 / (2.0 + 1e-6)));
  clip_scale(scale, norm, nsq, 0.0);  // clipping off
  REQUIRE(scale.data_as<float>()[0] == 1.0f);
}

TEST_CASE("sgd: momentum and decoupled decay over several steps, and linear in the gradient", "[sgd]") {
  const int64_t n = 41;
  Tensor p = f64({n}), b = f64({n}), g = f64({n}), scale = f64({1});
  fill_normal(p, 3);
  std::vector<double> rp(p.data_as<double>(), p.data_as<double>() + n), rb(n, 0.0);
  Tensor p32 = to32(p), b32 = f32({n}), s32 = f32({1});
  SGDHyper h;
  h.lr = 0.05, h.momentum = 0.9, h.weight_decay = 0.1;
  const double gs = 0.5;
  scale.data_as<double>()[0] = gs, s32.data_as<float>()[0] = float(gs);
  for (int step = 1; step <= 5; ++step) {
    fill_normal(g, 200 + step);
    // Reference: torch.optim.SGD's momentum buffer (dampening 0, the first step's buffer = g) with AdamW's
    // decoupled decay, written out in double.
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g.data_as<double>()[i] * gs;
      rb[i] = step == 1 ? gi : h.momentum * rb[i] + gi;
      rp[i] = rp[i] * (1 - h.lr * h.weight_decay) - h.lr * rb[i];
    }
    sgd_update(p, g, b, scale, h);
    sgd_update(p32, to32(g), b32, s32, h);
    for (int64_t i = 0; i < n; ++i) {
      // fp64: the same operations (a zero buffer times momentum adds exactly 0): a few ulp.
      REQUIRE(std::abs(p.data_as<double>()[i] - rp[i]) <= 1e-14 * (1 + std::abs(rp[i])));
      REQUIRE(std::abs(b.data_as<double>()[i] - rb[i]) <= 1e-14 * (1 + std::abs(rb[i])));
      // fp32: |p| ~ 1 rounded at 6e-8 per step, 5 steps: within 1e-6.
      REQUIRE(std::abs(double(p32.data_as<float>()[i]) - rp[i]) <= 1e-6 * (1 + std::abs(rp[i])));
    }
  }
  // Local SGD rests on linearity: the mean of two replicas' updates from one state is the update with the mean
  // gradient (parameters and momentum buffers alike).
  Tensor g1 = f64({n}), g2 = f64({n}), gm = f64({n});
  fill_normal(g1, 11), fill_normal(g2, 12);
  for (int64_t i = 0; i < n; ++i) gm.data_as<double>()[i] = 0.5 * (g1.data_as<double>()[i] + g2.data_as<double>()[i]);
  auto copy = [&](const Tensor& t) {
    Tensor c = f64({n});
    std::copy(t.data_as<double>(), t.data_as<double>() + n, c.data_as<double>());
    return c;
  };
  Tensor p1 = copy(p), b1 = copy(b), p2 = copy(p), b2 = copy(b), pm = copy(p), bm = copy(b);
  sgd_update(p1, g1, b1, scale, h), sgd_update(p2, g2, b2, scale, h), sgd_update(pm, gm, bm, scale, h);
  for (int64_t i = 0; i < n; ++i) {
    REQUIRE(0.5 * (p1.data_as<double>()[i] + p2.data_as<double>()[i]) ==
            Approx(pm.data_as<double>()[i]).epsilon(1e-14).margin(1e-15));
    REQUIRE(0.5 * (b1.data_as<double>()[i] + b2.data_as<double>()[i]) ==
            Approx(bm.data_as<double>()[i]).epsilon(1e-14).margin(1e-15));
  }
}

TEST_CASE("adamw: matches PyTorch's AdamW formula over several steps", "[adamw]") {
  const int64_t n = 37;
  Tensor p = f64({n}), m = f64({n}), v = f64({n}), g = f64({n}), scale = f64({1});
  fill_normal(p, 1), fill_normal(g, 2);
  std::vector<double> rp(p.data_as<double>(), p.data_as<double>() + n), rm(n, 0.0), rv(n, 0.0);
  Tensor p32 = to32(p), m32 = f32({n}), v32 = f32({n}), s32 = f32({1});
  AdamWHyper h;
  h.lr = 3e-3, h.beta1 = 0.9, h.beta2 = 0.95, h.eps = 1e-8, h.weight_decay = 0.1;
  const double gs = 0.4;  // a clipping factor < 1
  scale.data_as<double>()[0] = gs, s32.data_as<float>()[0] = float(gs);
  for (int64_t step = 1; step <= 5; ++step) {
    h.step = step;
    fill_normal(g, 100 + step);
    // Reference: torch.optim.AdamW._single_tensor_adamw, written out plainly in double.
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g.data_as<double>()[i] * gs;
      rp[i] *= 1 - h.lr * h.weight_decay;
      rm[i] = rm[i] * h.beta1 + (1 - h.beta1) * gi;
      rv[i] = rv[i] * h.beta2 + (1 - h.beta2) * gi * gi;
      const double bc1 = 1 - std::pow(h.beta1, double(step)), bc2 = 1 - std::pow(h.beta2, double(step));
      const double denom = std::sqrt(rv[i]) / std::sqrt(bc2) + h.eps;
      rp[i] += -(h.lr / bc1) * rm[i] / denom;
    }
    adamw_update(p, g, m, v, scale, h);
    adamw_update(p32, to32(g), m32, v32, s32, h);
    for (int64_t i = 0; i < n; ++i) {
      // fp64: the same operations in the same order up to association: agreement to a few ulp.
      REQUIRE(std::abs(p.data_as<double>()[i] - rp[i]) <= 1e-14 * (1 + std::abs(rp[i])));
      REQUIRE(std::abs(m.data_as<double>()[i] - rm[i]) <= 1e-15);
      REQUIRE(std::abs(v.data_as<double>()[i] - rv[i]) <= 1e-15);
      // fp32: each step moves p by ~lr = 3e-3 and rounds p (|p| ~ 1) at 6e-8: after 5 steps within 1e-6.
      REQUIRE(std::abs(double(p32.data_as<float>()[i]) - rp[i]) <= 1e-6 * (1 + std::abs(rp[i])));
    }
  }
  // The first step of Adam moves every weight by lr * g / (|g| + eps): after bias correction m = g, sqrt(v) = |g|.
  Tensor q = f64({n}), qm = f64({n}), qv = f64({n}), one = f64({1});
  one.data_as<double>()[0] = 1.0;
  fill_normal(g, 7);
  h.step = 1, h.weight_decay = 0;
  adamw_update(q, g, qm, qv, one, h);
  for (int64_t i = 0; i < n; ++i)
    REQUIRE(q.data_as<double>()[i] ==
            Approx(-h.lr * g.data_as<double>()[i] / (std::abs(g.data_as<double>()[i]) + h.eps)).epsilon(1e-12));
}

// The compute copy AdamW writes beside the fp32 masters (a mixed-precision step) is the updated masters rounded
// once, bit for bit what copy_convert writes; the masters and moments are those of the update without it.
TEST_CASE("adamw_update writes the rounded copy of its update bit for bit") {
  const int64_t n = 1001;  // odd: a tail past the vector loop
  for (DType d : {DType::BF16, DType::F16}) {
    Tensor normal = f64({n}), g = f32({n}), scale = f32({1});
    fill_normal(normal, 3);
    copy_convert(g, normal);
    fill_normal(normal, 1);
    scale.data_as<float>()[0] = 0.5f;
    Tensor p[2], m[2], v[2];
    for (int k = 0; k < 2; ++k) {
      p[k] = f32({n}), m[k] = Tensor::zeros({n}, DType::F32), v[k] = Tensor::zeros({n}, DType::F32);
      copy_convert(p[k], normal);
    }
    AdamWHyper h;
    h.weight_decay = 0.1;
    Tensor rounded = Tensor::empty({n}, d), expected = Tensor::empty({n}, d);
    for (h.step = 1; h.step <= 3; ++h.step) {
      adamw_update(p[0], g, m[0], v[0], scale, h, rounded);
      adamw_update(p[1], g, m[1], v[1], scale, h);
      copy_convert(expected, p[1]);
      REQUIRE(std::memcmp(rounded.data(), expected.data(), size_t(n) * 2) == 0);
      for (Tensor* t : {p, m, v}) REQUIRE(std::memcmp(t[0].data(), t[1].data(), size_t(n) * 4) == 0);
    }
  }
}

// Runs without a GPU: the shape of attention's saved record on each device (cpu: the probabilities; cuda: the
// flash kernel's log-sum-exp per query).
TEST_CASE("attention record shapes per device") {
  CHECK(kernels::attention_record_shape(Device::CPU, 2, 3, 5) == Shape{2, 3, 5, 5});
  CHECK(kernels::attention_record_shape(Device::CUDA, 2, 3, 5) == Shape{2, 3, 5});
}
