// 16-bit storage (bf16, fp16) of the dense CPU kernels: matmul, layernorm, gelu, the elementwise ops, embedding
// and the reductions. Each op runs in bf16 and fp16 and is compared with the fp32 kernel on the SAME inputs (random
// values rounded once to the 16-bit format, then widened to fp32 for the reference), so the only differences are
// the 16-bit kernel's own roundings.
//
// Tolerances follow from the format's unit roundoff u (2^-8 for bf16, 2^-11 for fp16): an output computed in fp32
// and rounded once to nearest is within u*|y| of the fp32 value y, plus the fp32 reference's own ~1e-6 relative
// noise, plus half the fp16 subnormal spacing (2^-25) for fp16 outputs below 2^-14. A kernel that truncated
// instead of rounding, rounded an intermediate too (two roundings of up to u each), or accumulated in 16 bits
// breaks that bound. Where the kernel is the fp32 kernel on the widened values (every op here but the reductions,
// whose double sums may take another order), the 16-bit output is even exactly the fp32 output rounded once, and
// the fp32 outputs (statistics, parameter gradients) are bitwise the fp32 kernel's: the tests check that too.
#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>

#include "core/tensor.h"
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
using Catch::Contains;

namespace {

constexpr DType kHalf[] = {DType::BF16, DType::F16};

double unit_roundoff(DType d) { return d == DType::BF16 ? 0x1p-8 : 0x1p-11; }
// Half the spacing of fp16's subnormals (outputs below 2^-14 are rounded to multiples of 2^-24); bf16 shares fp32's
// exponent range, so its rounding stays relative.
double subnormal_atol(DType d) { return d == DType::F16 ? 0x1p-25 : 0.0; }

Tensor convert(const Tensor& t, DType d) {
  Tensor r = Tensor::empty(t.shape(), d);
  copy_convert(r, t);
  return r;
}
Tensor to32(const Tensor& t) { return convert(t, DType::F32); }  // exact for 16-bit inputs
Tensor to64(const Tensor& t) { return convert(t, DType::F64); }

// Normal(shift, scale) values drawn in fp32 and rounded once to d: the inputs of a 16-bit kernel.
Tensor random(Shape s, DType d, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  Tensor f = Tensor::empty(s, DType::F32);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t i = 0; i < f.numel(); ++i) f.data_as<float>()[i] = float(shift + scale * nd(rng));
  return convert(f, d);
}
// Uniform values in [lo, hi), rounded once to d.
Tensor uniform(Shape s, DType d, uint64_t seed, double lo, double hi) {
  Tensor f = Tensor::empty(s, DType::F32);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> ud{float(lo), float(hi)};
  for (int64_t i = 0; i < f.numel(); ++i) f.data_as<float>()[i] = ud(rng);
  return convert(f, d);
}

Tensor filled(Shape s, DType d, double v) {
  Tensor f = Tensor::empty(s, DType::F64);
  for (int64_t i = 0; i < f.numel(); ++i) f.data_as<double>()[i] = v;
  return convert(f, d);
}
Tensor scalar(DType d, double v) { return filled({1}, d, v); }

// One value rounded to nearest even in the 16-bit format d (via fp32, as the kernels round their fp32 results).
double rounded(float v, DType d) {
  return d == DType::BF16 ? bf16_to_float(float_to_bf16(v)) : fp16_to_float(float_to_fp16(v));
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}
// The 16-bit result must be the fp32 reference rounded once (round to nearest even).
bool is_rounded_once(const Tensor& got16, const Tensor& ref32) {
  return same_bits(got16, convert(ref32, got16.dtype()));
}

// Largest |got - ref| / (rtol * |ref| + atol) over the elements: <= 1 means within the bound.
double err_ratio(const Tensor& got, const Tensor& ref, double rtol, double atol) {
  Tensor g = to64(got), r = to64(ref);
  REQUIRE(g.numel() == r.numel());
  double worst = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double x = g.data_as<double>()[i], y = r.data_as<double>()[i];
    worst = std::max(worst, std::abs(x - y) / (rtol * std::abs(y) + atol));
  }
  return worst;
}
// One rounding of an fp32 result: u |y| + the reference's ~1e-6 relative noise + fp16's subnormal half-spacing,
// plus `noise` for sums whose fp32 rounding error is absolute (cancellation), stated by each caller.
double rounded_once_err(const Tensor& got16, const Tensor& ref32, double noise = 0.0) {
  return err_ratio(got16, ref32, unit_roundoff(got16.dtype()) + 1e-6, subnormal_atol(got16.dtype()) + noise);
}

std::string abort_message(const std::function<void()>& f) {
  return mt::test::abort_message("precision_dense", f);
}

const char* name(DType d) { return dtype_name(d); }

}  // namespace

// Eigen widens bf16 and fp16 operands and runs its fp32 GEMM: the result is that GEMM's, rounded once, bit for bit.
// oneDNN's bf16 kernels read bf16 directly and sum in another order: the result meets the bound of one rounding
// of an fp32-accumulated product. Both are checked wherever they run (oneDNN's bf16 from AVX-512 on).
TEST_CASE("matmul in bf16/fp16: one rounding of the fp32 GEMM, fp32 parameter gradients", "[precision][matmul]") {
  using kernels::cpu::MatmulLibrary;
  // N * OC = 20480 > the parallel grain: the widening, the GEMM and the rounding all run multithreaded.
  const int64_t N = 64, C = 96, OC = 320;
  for (MatmulLibrary lib : {MatmulLibrary::Eigen, MatmulLibrary::OneDNN}) {
    const bool eigen = lib == MatmulLibrary::Eigen;
    if (!eigen && !kernels::cpu::onednn::has_avx512()) {
      WARN("oneDNN's bf16 matmul not checked: " << (kernels::cpu::onednn::available() ? "no AVX-512 on this CPU"
                                                                                     : "built without oneDNN"));
      continue;
    }
    kernels::cpu::UsingMatmulBackends use({lib, lib});
    for (DType d : kHalf)
      for (WeightLayout layout : {WeightLayout::InOut, WeightLayout::OutIn}) {
        if (!eigen && d != DType::BF16) continue;  // fp16 always widens on Eigen
        INFO(name(d) << (layout == WeightLayout::InOut ? " InOut" : " OutIn") << (eigen ? " Eigen" : " oneDNN"));
        const Shape ws = layout == WeightLayout::InOut ? Shape{C, OC} : Shape{OC, C};
        Tensor inp = random({N, C}, d, 1), w = random(ws, d, 2, 0.2), b = random({OC}, d, 3);
        Tensor out = Tensor::empty({N, OC}, d), out32 = Tensor::empty({N, OC}, DType::F32);
        matmul_forward(out, inp, w, b, layout);
        matmul_forward(out32, to32(inp), to32(w), to32(b), layout);
        // The same fp32 GEMM on the same values, bias added in fp32, then one rounding: bit for bit.
        if (eigen) CHECK(is_rounded_once(out, out32));
        // The bound any fp32-accumulating kernel meets: |y| ~ 2, terms ~ 0.2; fp32 summation-order noise of
        // C = 96 such products is ~ sqrt(96) * 0.2 * 6e-8 ~ 1e-7, covered 10x by 1e-6 absolute.
        CHECK(rounded_once_err(out, out32, 1e-6) <= 1);

        // Backward: dinp (=) rounded once; dweight, dbias fp32 (+=) equal to the fp32 kernel's on the same values.
        Tensor dout = random({N, OC}, d, 4), dinp = random({N, C}, d, 5, 100.0);  // dinp's preset is overwritten
        Tensor dw = random(ws, DType::F32, 6), db = random({OC}, DType::F32, 7);
        Tensor dw32 = to32(dw), db32 = to32(db), dinp32 = Tensor::empty({N, C}, DType::F32);
        matmul_backward(dinp, dw, db, dout, inp, w, layout);
        matmul_backward(dinp32, dw32, db32, to32(dout), to32(inp), to32(w), layout);
        if (eigen) CHECK(is_rounded_once(dinp, dinp32));
        CHECK(rounded_once_err(dinp, dinp32, 1e-5) <= 1);  // OC = 320 products of ~0.2: noise ~3e-7, 30x margin
        if (eigen) CHECK(same_bits(dw, dw32));
        // N = 64 products of two N(0, 1) values onto a preset N(0, 1): |dw| ~ 8, fp32 summation-order noise
        // ~ sqrt(64) * 1 * 6e-8 ~ 5e-7; 1e-5 absolute leaves a 20x margin (a lost product is ~1).
        CHECK(err_ratio(dw, dw32, 1e-6, 1e-5) <= 1);
        CHECK(same_bits(db, db32));  // the same loop over the same values on both libraries
      }
  }
}

TEST_CASE("matmul in bf16/fp16 accumulates in fp32", "[precision][matmul]") {
  // 8192 values in [0.01, 0.02), summed by the GEMM (forward, over C) and by dweight and dbias (over N). Each is a
  // multiple of 2^-14 (bf16) or 2^-17 (fp16) and every partial sum is below 2^7, so all partial sums are exact in
  // fp32 (at most 24 significant bits) in any order: an fp32-accumulated result is the exact sum, rounded once.
  // A 16-bit accumulator stops growing once half its spacing exceeds the addend (at 8 in bf16, 64 in fp16), far
  // short of the true ~123 (simulated below).
  const int64_t K = 8192, OC = 3;
  for (DType d : kHalf) {
    INFO(name(d));
    Tensor ones = filled({1, K}, d, 1.0), w = uniform({K, OC}, d, 1, 0.01, 0.02), out = Tensor::empty({1, OC}, d);
    matmul_forward(out, ones, w, Tensor(), WeightLayout::InOut);
    Tensor w64 = to64(w), exact = Tensor::empty({1, OC}, DType::F64);
    for (int64_t o = 0; o < OC; ++o) {
      double sum = 0, sum16 = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = w64.data_as<double>()[k * OC + o];
        sum += a;
        sum16 = rounded(float(sum16) + float(a), d);  // what a kernel accumulating in 16 bits would keep
      }
      exact.data_as<double>()[o] = sum;
      CHECK(sum16 < 0.6 * sum);  // the failure this test guards against is gross
    }
    CHECK(same_bits(out, convert(exact, d)));

    // dweight[1, OC] += ones^T @ dout and dbias += sum_n dout over N = 8192 rows: exact in fp32.
    Tensor dw = Tensor::empty({1, OC}, DType::F32), db = Tensor::empty({OC}, DType::F32);
    matmul_backward(Tensor(), dw, db, w, ones.view({K, 1}), Tensor::empty({1, OC}, d), WeightLayout::InOut);
    CHECK(same_bits(dw, convert(exact, DType::F32)));
    CHECK(same_bits(db, convert(exact, DType::F32).view({OC})));
  }
}

TEST_CASE("layernorm in bf16/fp16: fp32 statistics, outputs rounded once", "[precision][layernorm]") {
  const int64_t N = 256, C = 96;  // N * C > the parallel grain
  for (DType d : kHalf) {
    INFO(name(d));
    Tensor x = random({N, C}, d, 1, 2.0, 0.5), w = random({C}, d, 2, 0.5, 1.0), b = random({C}, d, 3, 0.3);
    Tensor out = Tensor::empty({N, C}, d), mean = Tensor::empty({N}, DType::F32), rstd = Tensor::empty({N}, DType::F32);
    layernorm_forward(out, mean, rstd, x, w, b);
    Tensor out32 = Tensor::empty({N, C}, DType::F32), mean32 = Tensor::empty({N}, DType::F32),
           rstd32 = Tensor::empty({N}, DType::F32);
    layernorm_forward(out32, mean32, rstd32, to32(x), to32(w), to32(b));
    // The statistics are the fp32 kernel's, computed in fp32 from the same values in the same order ...
    CHECK(same_bits(mean, mean32));
    CHECK(same_bits(rstd, rstd32));
    // ... so with matching statistics every output is the fp32 output rounded once.
    CHECK(is_rounded_once(out, out32));
    CHECK(rounded_once_err(out, out32, 1e-6) <= 1);  // |y| ~ 1: fp32 noise of a few roundings ~ 3e-7

    // Backward: dinp accumulates (+=) into 16 bits: old value + fp32 delta, rounded once. dweight and dbias are
    // fp32 sums over the rows (+=), the fp32 kernel's on the same values.
    Tensor dout = random({N, C}, d, 4), dinp = random({N, C}, d, 5);
    Tensor dw = random({C}, DType::F32, 6), db = random({C}, DType::F32, 7);
    Tensor dinp32 = to32(dinp), dw32 = to32(dw), db32 = to32(db);
    layernorm_backward(dinp, dw, db, dout, x, w, mean, rstd);
    layernorm_backward(dinp32, dw32, db32, to32(dout), to32(x), to32(w), mean32, rstd32);
    CHECK(is_rounded_once(dinp, dinp32));
    // |dinp| ~ 1; its fp32 terms (two row means over C = 96 of O(1) products) carry ~1e-6 absolute noise.
    CHECK(rounded_once_err(dinp, dinp32, 1e-5) <= 1);
    CHECK(same_bits(dw, dw32));
    CHECK(same_bits(db, db32));
  }
}

TEST_CASE("gelu in bf16/fp16: the fp32 expression rounded once", "[precision][gelu]") {
  const int64_t n = 40000 + 37;  // multithreaded, and a tail that is not a whole vector
  for (DType d : kHalf) {
    INFO(name(d));
    const double u = unit_roundoff(d);
    Tensor x = random({n}, d, 1, 3.0), y = Tensor::empty({n}, d), y32 = Tensor::empty({n}, DType::F32);
    gelu_forward(y, x);
    gelu_forward(y32, to32(x));
    CHECK(is_rounded_once(y, y32));
    CHECK(rounded_once_err(y, y32) <= 1);
    // The bound is tight: rounding toward zero instead of to nearest (errors up to one ulp, 2u) breaks it.
    Tensor truncated = convert(y32, d);
    for (int64_t i = 0; i < n; ++i) {
      uint16_t& h = static_cast<uint16_t*>(truncated.data())[i];
      const float y = y32.data_as<float>()[i];
      if (std::abs(rounded(y, d)) > std::abs(y)) --h;  // rounded away from zero: one ulp back toward it
    }
    CHECK(err_ratio(truncated, y32, u + 1e-6, subnormal_atol(d)) > 1.5);

    Tensor dout = random({n}, d, 2), dx = Tensor::empty({n}, d), dx32 = Tensor::empty({n}, DType::F32);
    gelu_backward(dx, x, dout);
    gelu_backward(dx32, to32(x), to32(dout));
    CHECK(is_rounded_once(dx, dx32));
    CHECK(rounded_once_err(dx, dx32) <= 1);
    gelu_backward(dout, x, dout);  // dinp aliasing dout: the same result
    CHECK(same_bits(dout, dx));
  }
}

TEST_CASE("add_forward and bias_add in bf16/fp16: one rounding of the fp32 sum", "[precision][elementwise]") {
  const int64_t N = 130, OC = 160;  // 20800 elements: multithreaded
  for (DType d : kHalf) {
    INFO(name(d));
    Tensor a = random({N, OC}, d, 1), b = random({N, OC}, d, 2, 0.01), out = Tensor::empty({N, OC}, d);
    Tensor out32 = Tensor::empty({N, OC}, DType::F32);
    add_forward(out, a, b);
    add_forward(out32, to32(a), to32(b));
    CHECK(is_rounded_once(out, out32));
    CHECK(rounded_once_err(out, out32) <= 1);
    add_forward(a, a, b);  // out aliasing a
    CHECK(same_bits(a, out));

    Tensor bias = random({OC}, d, 3), o32 = to32(out);
    bias_add(out, bias);
    bias_add(o32, to32(bias));
    CHECK(is_rounded_once(out, o32));
  }
}

TEST_CASE("accumulate across dtypes: dst += src formed in fp32 (fp64 with an fp64 side), rounded once into dst",
          "[precision][elementwise]") {
  const int64_t n = 20000;
  const DType all[] = {DType::F32, DType::F64, DType::BF16, DType::F16};
  for (DType dd : all)
    for (DType sd : all) {
      INFO("dst " << name(dd) << " += src " << name(sd));
      Tensor dst = random({n}, dd, 1), src = random({n}, sd, 2, 0.1);
      Tensor expect = to64(dst);
      Tensor src64 = to64(src);
      const bool wide = dd == DType::F64 || sd == DType::F64;
      for (int64_t i = 0; i < n; ++i) {
        double& e = expect.data_as<double>()[i];
        e = wide ? e + src64.data_as<double>()[i] : double(float(e) + float(src64.data_as<double>()[i]));
      }
      accumulate(dst, src);
      // One rounding into dst. (A 16-bit dst of an fp64 sum is rounded through fp32, as copy_convert does too.)
      CHECK(same_bits(dst, convert(expect, dd)));
    }
}

TEST_CASE("embedding in bf16/fp16: sums rounded once, fp32 table gradients", "[precision][embedding]") {
  const int64_t B = 4, T = 64, C = 72, V = 50;  // B*T*C > the parallel grain
  for (DType d : kHalf) {
    INFO(name(d));
    Tensor tokens = Tensor::empty({B, T}, DType::I32);
    for (int64_t i = 0; i < B * T; ++i) tokens.data_as<int32_t>()[i] = int32_t((i * 7) % V);
    Tensor wte = random({V, C}, d, 1), wpe = random({T, C}, d, 2, 0.1), out = Tensor::empty({B, T, C}, d);
    Tensor out32 = Tensor::empty({B, T, C}, DType::F32);
    embedding_forward(out, tokens, wte, wpe);
    embedding_forward(out32, tokens, to32(wte), to32(wpe));
    CHECK(is_rounded_once(out, out32));
    CHECK(rounded_once_err(out, out32) <= 1);
    // Without a position table the row is copied exactly; tokens of another vocabulary shard give zeros.
    embedding_forward(out, tokens, wte, Tensor(), 0, V);
    embedding_forward(out32, tokens, to32(wte), Tensor(), 0, V);
    CHECK(same_bits(out, convert(out32, d)));
    embedding_forward(out, tokens, wte.slice(0, {10, C}), Tensor(), 0, V);  // shard [0, 10)
    embedding_forward(out32, tokens, to32(wte).slice(0, {10, C}), Tensor(), 0, V);
    CHECK(same_bits(out, convert(out32, d)));

    // Backward: fp32 gradients accumulate the widened dout, in the fp32 kernel's order.
    Tensor dout = random({B, T, C}, d, 3), dwte = random({V, C}, DType::F32, 4), dwpe = random({T, C}, DType::F32, 5);
    Tensor dwte32 = to32(dwte), dwpe32 = to32(dwpe);
    embedding_backward(dwte, dwpe, dout, tokens);
    embedding_backward(dwte32, dwpe32, to32(dout), tokens);
    CHECK(same_bits(dwte, dwte32));
    CHECK(same_bits(dwpe, dwpe32));

    // One token repeated 8192 times, dout in [0.01, 0.02): the fp32 row sum is exact (see the matmul
    // accumulation test); a 16-bit accumulator would stall near 8 (bf16) or 64 (fp16) of the true ~123.
    const int64_t BB = 128, TT = 64;
    Tensor same = Tensor::empty({BB, TT}, DType::I32), g = uniform({BB, TT, 1}, d, 6, 0.01, 0.02);
    for (int64_t i = 0; i < BB * TT; ++i) same.data_as<int32_t>()[i] = 3;
    Tensor dtab = Tensor::empty({V, 1}, DType::F32), g64 = to64(g);
    embedding_backward(dtab, Tensor(), g, same);
    double sum = 0;
    for (int64_t i = 0; i < BB * TT; ++i) sum += g64.data_as<double>()[i];
    CHECK(dtab.data_as<float>()[3] == sum);
  }
}

TEST_CASE("sum and sum of squares over 16-bit inputs: double sums of the widened values", "[precision][reduce]") {
  const int64_t n = 1 << 16;  // multithreaded
  for (DType d : kHalf) {
    INFO(name(d));
    Tensor x = random({n}, d, 1), x64 = to64(x);
    double sum = 0, sum_abs = 0, sum_sq = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = x64.data_as<double>()[i];
      sum += v, sum_abs += std::abs(v), sum_sq += v * v;
    }
    for (DType ad : {DType::F32, DType::F64}) {
      INFO("acc " << name(ad));
      Tensor s16 = scalar(ad, 0.5), s32 = scalar(ad, 0.5), q16 = scalar(ad, 0), q32 = scalar(ad, 0);
      sum_accumulate(s16, x), sum_accumulate(s32, to32(x));
      sum_squares_accumulate(q16, x), sum_squares_accumulate(q32, to32(x));
      // Double sums of the same values as over the widened fp32 tensor and as the test's own sum, up to the
      // summation order (the vector lanes differ with the element type), which moves a double sum by at most
      // ~n * 2^-53 ~ 1e-11 of the sum of magnitudes; an fp32 accumulator adds one rounding (2^-24 relative).
      const double u_acc = ad == DType::F32 ? 0x1p-24 : 0.0;
      auto get = [](const Tensor& t) { return to64(t).data_as<double>()[0]; };
      CHECK(std::abs(get(s16) - get(s32)) <= 2 * u_acc * std::abs(get(s32)) + 1e-11 * sum_abs);
      CHECK(std::abs(get(q16) - get(q32)) <= (2 * u_acc + 1e-11) * sum_sq);
      CHECK(std::abs(get(s16) - (0.5 + sum)) <= u_acc * std::abs(0.5 + sum) + 1e-11 * sum_abs);
      CHECK(std::abs(get(q16) - sum_sq) <= (u_acc + 1e-11) * sum_sq);
    }
    // Many small values: 65536 * ~0.015 ~ 983, far beyond where a 16-bit accumulator stalls; every partial sum
    // is exact in double, so the result is too.
    Tensor small = uniform({n}, d, 2, 0.01, 0.02), small64 = to64(small), acc = scalar(DType::F64, 0);
    double exact = 0;
    for (int64_t i = 0; i < n; ++i) exact += small64.data_as<double>()[i];
    sum_accumulate(acc, small);
    CHECK(acc.data_as<double>()[0] == exact);
  }
}

TEST_CASE("clip_scale with a loss scale: the true norm, and a scale that unscales as it clips", "[precision][reduce]") {
  // Gradients of the loss times s = 1024 whose true norm is 5: norm_sq = (5 * 1024)^2, exact in fp32 and fp64.
  const double s = 1024, inv = 1 / s;
  for (DType dt : {DType::F32, DType::F64}) {
    INFO(name(dt));
    Tensor nsq = scalar(dt, (5 * s) * (5 * s)), norm = scalar(dt, 0), scale = scalar(dt, 0);
    auto get = [](const Tensor& t) { return to64(t).data_as<double>()[0]; };
    const double tol = dt == DType::F32 ? 0x1p-24 : 1e-15;  // one rounding of the stored result

    clip_scale(scale, norm, nsq, 1.0, inv);  // clipped: coef = 1 / (5 + 1e-6) from the TRUE norm
    CHECK(get(norm) == 5.0);                // sqrt(5120^2) / 1024, exact
    CHECK(std::abs(get(scale) - (1.0 / (5.0 + 1e-6)) * inv) <= tol * inv);
    // The same as clipping the unscaled gradients (norm_sq 25; inv_loss_scale defaults to 1), divided by s.
    Tensor nsq1 = scalar(dt, 25), norm1 = scalar(dt, 0), scale1 = scalar(dt, 0);
    clip_scale(scale1, norm1, nsq1, 1.0);
    CHECK(get(norm1) == 5.0);
    CHECK(std::abs(get(scale) * s - get(scale1)) <= tol * get(scale1));

    clip_scale(scale, norm, nsq, 10.0, inv);  // true norm 5 < 10: no clipping, only the unscaling
    CHECK(get(scale) == inv);
    CHECK(get(norm) == 5.0);
    clip_scale(scale, norm, nsq, 0.0, inv);  // clipping off
    CHECK(get(scale) == inv);
  }
}

TEST_CASE("16-bit kernels check their argument dtypes", "[precision][checks]") {
  const int64_t N = 2, C = 8;
  Tensor x = random({N, C}, DType::BF16, 1), w = random({C}, DType::BF16, 2), b = random({C}, DType::BF16, 3);
  Tensor out = Tensor::empty({N, C}, DType::BF16);
  Tensor mean32 = Tensor::empty({N}, DType::F32), rstd32 = Tensor::empty({N}, DType::F32);
  // Statistics in the accumulation dtype (fp32) with bf16 activations: accepted (runs here, in this process).
  layernorm_forward(out, mean32, rstd32, x, w, b);
  CHECK(std::isfinite(rstd32.data_as<float>()[0]));
  Tensor mean16 = Tensor::empty({N}, DType::BF16);
  CHECK_THAT(abort_message([&] { layernorm_forward(out, mean16, rstd32, x, w, b); }),
             Contains("layernorm_forward: mean is bf16, expected fp32 (the accumulation dtype of bf16)"));
  Tensor dw16 = Tensor::empty({C}, DType::BF16), dw32 = Tensor::empty({C}, DType::F32);
  CHECK_THAT(abort_message([&] { layernorm_backward(out, dw16, dw32, x, x, w, mean32, rstd32); }),
             Contains("layernorm_backward: dweight is bf16, expected fp32 (the accumulation dtype of bf16)"));

  Tensor xm = random({N, C}, DType::F16, 4), wm = random({C, C}, DType::F16, 5);
  Tensor dwm16 = Tensor::empty({C, C}, DType::F16), dwm64 = Tensor::empty({C, C}, DType::F64);
  CHECK_THAT(abort_message([&] { matmul_backward(Tensor(), dwm16, Tensor(), xm, xm, wm, WeightLayout::InOut); }),
             Contains("matmul_backward: dweight is fp16, expected fp32 (the accumulation dtype of fp16)"));
  CHECK_THAT(abort_message([&] { matmul_backward(Tensor(), dwm64, Tensor(), xm, xm, wm, WeightLayout::InOut); }),
             Contains("matmul_backward: dweight is fp64, expected fp32 (the accumulation dtype of fp16)"));
  CHECK_THAT(abort_message([&] { matmul_forward(Tensor::empty({N, C}, DType::F16), xm, to32(wm), Tensor(),
                                                WeightLayout::InOut); }),
             Contains("matmul_forward: weight is fp32 but inp is fp16"));

  Tensor tokens = Tensor::empty({1, 2}, DType::I32), dout = random({1, 2, C}, DType::BF16, 6);
  CHECK_THAT(abort_message([&] { embedding_backward(Tensor::empty({4, C}, DType::BF16), Tensor(), dout, tokens); }),
             Contains("embedding_backward: dwte is bf16, expected fp32 (the accumulation dtype of bf16)"));
  CHECK_THAT(abort_message([&] { add_forward(out, x, convert(x, DType::F16)); }),
             Contains("add_forward: b is fp16 but a is bf16"));
  CHECK_THAT(abort_message([&] { gelu_forward(tokens, tokens); }),
             Contains("gelu_forward: inp must be fp32, fp64, bf16 or fp16, is int32"));
  Tensor one = Tensor::empty({1}, DType::F32);
  CHECK_THAT(abort_message([&] { sum_accumulate(Tensor::empty({1}, DType::BF16), x); }),
             Contains("sum_accumulate: acc must be fp32 or fp64, is bf16"));
  CHECK_THAT(abort_message([&] { clip_scale(one, one, one, 1.0, 0.0); }),
             Contains("clip_scale: inv_loss_scale = 0 must be finite and > 0"));
}
