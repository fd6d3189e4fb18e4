// Tests of the CPU kernels a Llama-family model adds: RMSNorm, rotary position embeddings, SwiGLU and the
// grouped-query attention expansion. For each: the forward pass against a direct computation in double, the
// gradients against central differences in fp64 (mt::test::gradcheck, whose tolerance is justified there), the
// = / += semantics of every output, and the fp32, bf16 and fp16 kernels against the fp64 kernel run on the same
// (rounded) inputs. SwiGLU and GQA take separate projection outputs (gate, up; q, k, v): which of them may alias
// or overlap is tested too, the refusals in a child process (a failed check aborts).
//
// Reduced-precision tolerances: the 16-bit kernels compute in fp32 and round each output once, so an output may
// differ from the exact value on its inputs by one rounding, u |y| (u = 2^-8 for bf16, 2^-11 for fp16, the unit
// roundoff), plus the fp32 arithmetic's own error, which each test bounds for its op (`e32`, relative, and an
// absolute term where the op can cancel). A kernel that rounded twice, read a wrong element or lost a sign fails
// these bounds.
#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/gqa.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "test_support.h"

using namespace mt;
using namespace mt::kernels;

namespace {

Tensor f64(Shape s) { return Tensor::empty(s, DType::F64); }

void fill_normal(const Tensor& t, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  double* p = t.data_as<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = shift + scale * nd(rng);
}

Tensor convert(const Tensor& t, DType dt) {
  Tensor r = Tensor::empty(t.shape(), dt);
  copy_convert(r, t);
  return r;
}
Tensor to64(const Tensor& t) { return convert(t, DType::F64); }
Tensor clone(const Tensor& t) { return convert(t, t.dtype()); }
// t's values rounded to dt and back to fp64: the inputs a dt kernel sees, for the fp64 reference.
Tensor rounded(const Tensor& t, DType dt) { return to64(convert(t, dt)); }

double* d(const Tensor& t) { return t.data_as<double>(); }

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += d(a)[i] * d(b)[i];
  return s;
}

// r = a - a0 (the part an accumulating kernel added).
Tensor minus(const Tensor& a, const Tensor& a0) {
  Tensor r = f64(a.shape());
  for (int64_t i = 0; i < r.numel(); ++i) d(r)[i] = d(a)[i] - d(a0)[i];
  return r;
}

// Largest |a - b| / (atol + rtol * |b|) over the elements: <= 1 means they agree.
double max_err(const Tensor& a, const Tensor& b, double rtol, double atol) {
  REQUIRE(a.numel() == b.numel());
  const Tensor a64 = to64(a), b64 = to64(b);
  double worst = 0;
  int64_t at = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = d(a64)[i], y = d(b64)[i];
    const double e = std::isfinite(x) ? std::abs(x - y) / (atol + rtol * std::abs(y)) : HUGE_VAL;
    if (e > worst) worst = e, at = i;
  }
  if (a.numel() > 0) UNSCOPED_INFO("worst element " << at << ": " << d(a64)[at] << " vs " << d(b64)[at]);
  return worst;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// The unit roundoff of a storage dtype (fp64 never reaches here).
double unit_roundoff(DType dt) {
  switch (dt) {
    case DType::BF16: return std::ldexp(1.0, -8);
    case DType::F16: return std::ldexp(1.0, -11);
    default: return std::ldexp(1.0, -24);
  }
}

// Half the spacing of fp16's subnormals (2^-25): the absolute rounding error of an output below fp16's normal
// range, where the relative bound u |y| no longer holds. bf16 and fp32 share fp32's range: nothing needed.
double subnormal_slack(DType dt) { return dt == DType::F16 ? std::ldexp(1.0, -25) : 0.0; }

const DType kReducedDtypes[] = {DType::F32, DType::BF16, DType::F16};

using mt::test::gradcheck;

std::string abort_message(const std::function<void()>& f) {
  return mt::test::abort_message("kernels_llama", f);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------- RMSNorm

TEST_CASE("rmsnorm: forward by hand, gradients, accumulation", "[rmsnorm]") {
  const int64_t B = 2, T = 3, C = 8, N = B * T;
  // eps 0.5 is large enough that a kernel ignoring eps, or adding it outside the square root, fails the forward.
  for (double eps : {1e-5, 0.5}) {
    INFO("eps " << eps);
    Tensor inp = f64({B, T, C}), w = f64({C}), out = f64({B, T, C}), rstd = f64({N}), proj = f64({B, T, C});
    fill_normal(inp, 1, 2.0, 0.5), fill_normal(w, 2, 0.5, 1.0), fill_normal(proj, 3);
    auto loss = [&] {
      rmsnorm_forward(out, rstd, inp, w, eps);
      return dot(out, proj);
    };
    loss();
    for (int64_t n = 0; n < N; ++n) {
      double ss = 0;
      for (int64_t c = 0; c < C; ++c) ss += d(inp)[n * C + c] * d(inp)[n * C + c];
      const double r = 1 / std::sqrt(ss / C + eps);
      REQUIRE(std::abs(d(rstd)[n] - r) <= 1e-14 * r);  // a handful of fp64 roundings
      for (int64_t c = 0; c < C; ++c) {
        const double y = d(inp)[n * C + c] * r * d(w)[c];
        REQUIRE(std::abs(d(out)[n * C + c] - y) <= 1e-14 * (1 + std::abs(y)));
      }
    }
    // Both gradients accumulate: start them from random values and check what was added.
    Tensor dinp0 = f64({B, T, C}), dw0 = f64({C});
    fill_normal(dinp0, 4), fill_normal(dw0, 5);
    Tensor dinp = clone(dinp0), dw = clone(dw0);
    rmsnorm_backward(dinp, dw, proj, inp, w, rstd);
    const Tensor gi = minus(dinp, dinp0), gw = minus(dw, dw0);
    gradcheck(loss, {{"inp", inp, gi}, {"weight", w, gw}});
    // A second call adds the same amount again.
    rmsnorm_backward(dinp, dw, proj, inp, w, rstd);
    for (int64_t i = 0; i < gi.numel(); ++i) REQUIRE(std::abs(d(dinp)[i] - d(dinp0)[i] - 2 * d(gi)[i]) <= 1e-13);
    for (int64_t c = 0; c < C; ++c) REQUIRE(std::abs(d(dw)[c] - d(dw0)[c] - 2 * d(gw)[c]) <= 1e-13);
  }
}

TEST_CASE("rmsnorm: fp32, bf16 and fp16 against fp64, forward and backward", "[rmsnorm]") {
  const double eps = 1e-6;
  // N*C = 38400 takes the multithreaded path; C = 72 is not a multiple of the vector width.
  for (auto [N, C] : {std::pair<int64_t, int64_t>{37, 72}, {300, 128}}) {
    Tensor inp = f64({N, C}), w = f64({C}), dout = f64({N, C}), dinp0 = f64({N, C});
    fill_normal(inp, 1, 1.5, 0.2), fill_normal(w, 2, 0.3, 1.0), fill_normal(dout, 3), fill_normal(dinp0, 4);
    for (DType dt : kReducedDtypes) {
      INFO(dtype_name(dt) << " N=" << N << " C=" << C);
      const DType acc = acc_dtype(dt);
      const double u = unit_roundoff(dt);
      // The fp64 reference on the dt-rounded inputs.
      const Tensor x = rounded(inp, dt), wr = rounded(w, dt), dy = rounded(dout, dt), d0 = rounded(dinp0, dt);
      Tensor out = f64({N, C}), rstd = f64({N}), dinp = clone(d0), dw = f64({C});
      rmsnorm_forward(out, rstd, x, wr, eps);
      rmsnorm_backward(dinp, dw, dy, x, wr, rstd);

      Tensor out_t = Tensor::empty({N, C}, dt), rstd_t = Tensor::empty({N}, acc);
      Tensor dinp_t = convert(d0, dt), dw_t = Tensor::empty({C}, acc);
      rmsnorm_forward(out_t, rstd_t, convert(x, dt), convert(wr, dt), eps);
      rmsnorm_backward(dinp_t, dw_t, convert(dy, dt), convert(x, dt), convert(wr, dt), rstd_t);
      // e32: a C-term fp32 sum of squares is within C u32 relative, halved by the square root, and a few more
      // roundings: <= 4.2e-6 for C = 128.
      const double e32 = 1e-5;
      REQUIRE(max_err(out_t, out, u + e32, subnormal_slack(dt)) <= 1);
      REQUIRE(max_err(rstd_t, rstd, e32, 0) <= 1);
      // dinp = round(dinp0 + r (g - xhat mean(g xhat))): one rounding of a sum whose fp32 error is that of
      // C-term sums of O(1) products, < 1e-5 absolute (the layernorm tests' bound for the same structure).
      REQUIRE(max_err(dinp_t, dinp, u + 1e-5, 1e-5) <= 1);
      // dweight: N-term fp32 sums of O(1) products, ~sqrt(N) u32 relative in practice; 1e-4 as the layernorm
      // tests use for 300-term sums.
      REQUIRE(max_err(dw_t, dw, 1e-4, 1e-4) <= 1);
    }
  }
}

// ------------------------------------------------------------------------------------ rotary position embeddings

namespace {

// The rotation of a checkpoint's half-split layout, as its reference code writes it for one head x[HS] at
// position pos: inv_freq[j] = 1 / theta^(2j / HS), emb = cat(freqs, freqs), rotate_half(x) = cat(-x2, x1),
// x' = x * cos(emb) + rotate_half(x) * sin(emb). Independent of the kernel's formulation on purpose.
std::vector<double> rotate_by_hand(const double* x, int64_t HS, double pos, double theta) {
  const int64_t half = HS / 2;
  std::vector<double> emb(HS), rot(HS), out(HS);
  for (int64_t j = 0; j < half; ++j) emb[j] = emb[j + half] = pos * (1.0 / std::pow(theta, double(2 * j) / HS));
  for (int64_t j = 0; j < half; ++j) rot[j] = -x[j + half], rot[j + half] = x[j];
  for (int64_t i = 0; i < HS; ++i) out[i] = x[i] * std::cos(emb[i]) + rot[i] * std::sin(emb[i]);
  return out;
}

}  // namespace

TEST_CASE("rope: forward equals the half-split rotation by hand, only in the column range", "[rope]") {
  const int64_t B = 2, T = 5, NH = 3, HS = 8, C = NH * HS, W = 3 * C;  // a fused qkv row: q | k | v
  struct Case {
    int64_t col_begin, col_end, pos_offset;
    double theta;
  };
  // q and k of the fused row; one head in the middle (a range not at column 0); a continuation at position 7; a
  // small base (large angles); an empty range.
  for (const Case& c : {Case{0, 2 * C, 0, kRopeTheta}, Case{HS, 2 * HS, 0, kRopeTheta}, Case{0, 2 * C, 7, 1e4},
                        Case{C, 3 * C, 3, 50.0}, Case{4, 4, 0, kRopeTheta}}) {
    INFO("columns [" << c.col_begin << ", " << c.col_end << ") offset " << c.pos_offset << " theta " << c.theta);
    Tensor x0 = f64({B, T, W});
    fill_normal(x0, 1);
    Tensor x = clone(x0);
    rope_forward(x, T, HS, c.theta, c.col_begin, c.col_end, c.pos_offset);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t row = (b * T + t) * W;
        for (int64_t col = 0; col < W; col += HS) {
          const double* in = d(x0) + row + col;
          const double* got = d(x) + row + col;
          if (col < c.col_begin || col >= c.col_end) {  // outside the range: untouched, bit for bit
            REQUIRE(std::memcmp(in, got, HS * sizeof(double)) == 0);
            continue;
          }
          const std::vector<double> want = rotate_by_hand(in, HS, double(c.pos_offset + t), c.theta);
          for (int64_t i = 0; i < HS; ++i) {
            INFO("b " << b << " t " << t << " column " << col + i);
            // Angles below 12 rad: cos and sin to ~1e-16 absolute on either side, O(1) values.
            REQUIRE(std::abs(got[i] - want[i]) <= 1e-13);
          }
        }
      }
  }
}

TEST_CASE("rope: gradient, inverse, position offset, fp64 and fp32", "[rope]") {
  const int64_t B = 2, T = 4, HS = 6, W = 5 * HS, col_begin = HS, col_end = 4 * HS;
  Tensor x = f64({B, T, W}), proj = f64({B, T, W}), y = f64({B, T, W});
  fill_normal(x, 1), fill_normal(proj, 2);
  const double theta = 100.0;
  const int64_t offset = 2;
  auto loss = [&] {
    copy_convert(y, x);
    rope_forward(y, T, HS, theta, col_begin, col_end, offset);
    return dot(y, proj);
  };
  // The gradient is rope_backward of dout; columns outside the range pass dout through (identity).
  Tensor g = clone(proj);
  rope_backward(g, T, HS, theta, col_begin, col_end, offset);
  gradcheck(loss, {{"x", x, g}});

  // The rotation is orthogonal: backward (its transpose) undoes forward, to a few fp64 roundings.
  Tensor z = clone(x);
  rope_forward(z, T, HS, theta, col_begin, col_end, offset);
  rope_backward(z, T, HS, theta, col_begin, col_end, offset);
  REQUIRE(max_err(z, x, 0, 1e-14) <= 1);
  Tensor z32 = convert(x, DType::F32);
  rope_forward(z32, T, HS, theta, col_begin, col_end, offset);
  rope_backward(z32, T, HS, theta, col_begin, col_end, offset);
  REQUIRE(max_err(z32, x, 0, 2e-6) <= 1);  // two fp32 rotations of |x| < 5 values: ~8 u32 |x|

  // pos_offset continues a sequence: rows of T2 = 3 at offset 4 equal rows 4..6 of a sequence of 7 at offset 0,
  // bit for bit (the same double angles, rounded the same way).
  for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
    INFO(dtype_name(dt));
    Tensor seq = f64({1, 7, W});
    fill_normal(seq, 3);
    Tensor full = convert(seq, dt), tail = convert(seq.slice(4 * W, {1, 3, W}), dt);
    rope_forward(full, 7, HS, theta, 0, W, 0);
    rope_forward(tail, 3, HS, theta, 0, W, 4);
    REQUIRE(same_bits(tail, full.slice(4 * W, {1, 3, W})));
  }
}

TEST_CASE("rope: fp32, bf16 and fp16 against fp64, at large positions too", "[rope]") {
  // 4 sequences of 64 rows of q | k | v with 4 heads of 64: N*W above the parallel grain.
  const int64_t B = 4, T = 64, NH = 4, HS = 64, C = NH * HS, W = 3 * C;
  Tensor x = f64({B, T, W});
  fill_normal(x, 1);
  double max_abs = 0;
  for (int64_t i = 0; i < x.numel(); ++i) max_abs = std::max(max_abs, std::abs(d(x)[i]));
  // Position 1e5 + 63: angles up to 1e5 rad. Formed in fp32 they would be off by up to 1e5 * 2^-24 ~ 6e-3 rad,
  // far outside these tolerances; the kernel forms them in double.
  for (int64_t offset : {int64_t(0), int64_t(100000)}) {
    for (DType dt : kReducedDtypes) {
      INFO(dtype_name(dt) << " offset " << offset);
      const double u = unit_roundoff(dt);
      const Tensor xr = rounded(x, dt);
      for (bool backward : {false, true}) {
        INFO((backward ? "backward" : "forward"));
        Tensor ref = clone(xr), got = convert(xr, dt);
        auto apply = backward ? rope_backward : rope_forward;
        apply(ref, T, HS, kRopeTheta, 0, 2 * C, offset);
        apply(got, T, HS, kRopeTheta, 0, 2 * C, offset);
        // e32: cos and sin rounded to fp32, two products and a sum: <= 4 u32 (|a| + |b|) absolute, which can
        // exceed u32 |y| where the two terms cancel; bounded by 8 u32 max|x|.
        REQUIRE(max_err(got, ref, u, 8 * std::ldexp(1.0, -24) * max_abs + subnormal_slack(dt)) <= 1);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------------ SwiGLU

TEST_CASE("swiglu: forward by hand, gradients, overwrite", "[swiglu]") {
  const int64_t N = 6, H = 5;
  Tensor gate = f64({2, 3, H}), up = f64({2, 3, H}), out = f64({2, 3, H}), proj = f64({2, 3, H});
  fill_normal(gate, 1, 2.0), fill_normal(up, 2, 2.0), fill_normal(proj, 3);
  auto loss = [&] {
    swiglu_forward(out, gate, up);
    return dot(out, proj);
  };
  loss();
  for (int64_t i = 0; i < N * H; ++i) {
    const double g = d(gate)[i], u = d(up)[i];
    const double want = g / (1 + std::exp(-g)) * u;  // silu of the gate, not of up
    REQUIRE(std::abs(d(out)[i] - want) <= 1e-14 * (1 + std::abs(want)));
  }
  // dgate and dup are overwritten: preset garbage must vanish.
  Tensor dgate = f64({2, 3, H}), dup = f64({2, 3, H});
  fill_normal(dgate, 4, 100.0), fill_normal(dup, 5, 100.0);
  swiglu_backward(dgate, dup, proj, gate, up);
  gradcheck(loss, {{"gate", gate, dgate}, {"up", up, dup}});
}

TEST_CASE("swiglu: outputs that alias inputs give the same bits", "[swiglu]") {
  // Each output replaced by each input it may alias, in every dtype; N*H = 29100 runs multithreaded and is not a
  // multiple of the CPU kernel's chunk, [7, 9] is one partial chunk.
  enum Slot { kOwn, kGate, kUp, kDout };
  const char* slot_name[] = {"its own tensor", "gate", "up", "dout"};
  for (DType dt : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
    for (auto [N, H] : {std::pair<int64_t, int64_t>{300, 97}, {7, 9}}) {
      INFO(dtype_name(dt) << " N=" << N << " H=" << H);
      Tensor g64 = f64({N, H}), u64 = f64({N, H}), dy64 = f64({N, H});
      fill_normal(g64, 1, 2.0), fill_normal(u64, 2), fill_normal(dy64, 3);
      const Tensor gate = convert(g64, dt), up = convert(u64, dt), dout = convert(dy64, dt);
      Tensor out = Tensor::empty({N, H}, dt), dgate = Tensor::empty({N, H}, dt), dup = Tensor::empty({N, H}, dt);
      swiglu_forward(out, gate, up);
      swiglu_backward(dgate, dup, dout, gate, up);

      for (Slot s : {kGate, kUp}) {
        INFO("forward: out is " << slot_name[s]);
        Tensor g = clone(gate), u = clone(up);
        const Tensor o = s == kGate ? g : u;
        swiglu_forward(o, g, u);
        REQUIRE(same_bits(o, out));
      }
      for (Slot sg : {kOwn, kGate, kUp, kDout})
        for (Slot su : {kOwn, kGate, kUp, kDout}) {
          if (sg == su && sg != kOwn) continue;  // dgate and dup may not share elements
          INFO("backward: dgate is " << slot_name[sg] << ", dup is " << slot_name[su]);
          const Tensor g = clone(gate), u = clone(up), dy = clone(dout);
          const Tensor in[] = {Tensor(), g, u, dy};
          const Tensor dg = sg == kOwn ? Tensor::empty({N, H}, dt) : in[sg];
          const Tensor du = su == kOwn ? Tensor::empty({N, H}, dt) : in[su];
          swiglu_backward(dg, du, dy, g, u);
          REQUIRE(same_bits(dg, dgate));
          REQUIRE(same_bits(du, dup));
        }
    }
  }
}

TEST_CASE("swiglu: partial overlaps, shared outputs and wrong shapes are refused", "[swiglu]") {
  const int64_t N = 4, H = 8, n = N * H;
  Tensor buf = f64({3 * n + 1}), other = f64({n}), other2 = f64({n});
  fill_normal(buf, 1), fill_normal(other, 2), fill_normal(other2, 3);
  // Views of one buffer: a, b = a shifted by one element (a partial overlap), c disjoint from both.
  const Tensor a = buf.slice(0, {N, H}), b = buf.slice(1, {N, H}), c = buf.slice(2 * n, {N, H});
  const Tensor x = other.slice(0, {N, H}), y = other2.slice(0, {N, H});
  struct Case {
    const char* what;
    std::function<void()> call;
    const char* message;
  };
  const Case cases[] = {
      {"out one element into gate", [&] { swiglu_forward(b, a, x); }, "out overlaps gate without being the same"},
      {"out one element into up", [&] { swiglu_forward(b, x, a); }, "out overlaps up without being the same"},
      {"dgate is dup", [&] { swiglu_backward(c, c, x, y, a); }, "dgate overlaps dup"},
      {"dup one element into dgate", [&] { swiglu_backward(a, b, x, y, c); }, "dgate overlaps dup"},
      {"dgate one element into dout", [&] { swiglu_backward(b, c, a, x, y); }, "dgate overlaps dout without"},
      {"dup one element into gate", [&] { swiglu_backward(c, b, x, a, y); }, "dup overlaps gate without"},
      {"dup one element into up", [&] { swiglu_backward(c, b, x, y, a); }, "dup overlaps up without"},
      {"up of another shape", [&] { swiglu_forward(c, x, f64({N, H + 1})); }, "up has shape"},
      {"dup of another dtype",
       [&] { swiglu_backward(c, Tensor::empty({N, H}, DType::F32), x, y, a); }, "dup is fp32 but gate is fp64"},
  };
  for (const Case& k : cases) {
    INFO(k.what);
    const std::string msg = abort_message(k.call);
    INFO("stderr: " << msg);
    REQUIRE(msg.find(k.message) != std::string::npos);
  }
  // Such calls on disjoint tensors run.
  Tensor z = f64({N, H});
  fill_normal(z, 4);
  swiglu_forward(c, a, x);
  swiglu_backward(a, c, x, y, z);
}

TEST_CASE("swiglu: saturated gates stay finite", "[swiglu]") {
  // exp(-g) overflows for g = -1000 (in every dtype): silu must give -0, its derivative 0, not NaN.
  for (DType dt : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
    INFO(dtype_name(dt));
    Tensor g64 = f64({1, 4}), u64 = f64({1, 4});
    const double gates[4] = {-1000, 1000, -60, 60}, ups[4] = {1.5, -2.0, 3.0, 0.5};
    std::copy(gates, gates + 4, d(g64)), std::copy(ups, ups + 4, d(u64));
    const Tensor gate = convert(g64, dt), up = convert(u64, dt), dout = convert(u64, dt);  // any finite dout
    Tensor out = Tensor::empty({1, 4}, dt), dgate = Tensor::empty({1, 4}, dt), dup = Tensor::empty({1, 4}, dt);
    swiglu_forward(out, gate, up);
    swiglu_backward(dgate, dup, dout, gate, up);
    const Tensor o = to64(out), dg = to64(dgate), du = to64(dup);
    REQUIRE(std::abs(d(o)[0]) == 0);                          // silu(-1000) * 1.5
    REQUIRE(std::abs(d(o)[1] - 1000 * -2.0) <= 1e-2 * 2000);  // silu(1000) = 1000 (1000 rounds in every dtype)
    for (int i = 0; i < 4; ++i) REQUIRE((std::isfinite(d(dg)[i]) && std::isfinite(d(du)[i])));
    REQUIRE(d(dg)[0] == 0);  // d silu / dg at -1000 is 0
    REQUIRE(d(du)[0] == 0);  // silu(-1000) * dout
  }
}

TEST_CASE("swiglu: fp32, bf16 and fp16 against fp64, forward and backward", "[swiglu]") {
  // N*H = 28800 takes the multithreaded path; H = 9 (N*H = 63) is not a multiple of the vector width.
  for (auto [N, H] : {std::pair<int64_t, int64_t>{300, 96}, {7, 9}}) {
    Tensor gate = f64({N, H}), up = f64({N, H}), dout = f64({N, H});
    fill_normal(gate, 1, 2.0), fill_normal(up, 2, 2.0), fill_normal(dout, 3);
    for (DType dt : kReducedDtypes) {
      INFO(dtype_name(dt) << " N=" << N << " H=" << H);
      const double u = unit_roundoff(dt);
      const Tensor g = rounded(gate, dt), up_r = rounded(up, dt), dy = rounded(dout, dt);
      Tensor out = f64({N, H}), dgate = f64({N, H}), dup = f64({N, H});
      swiglu_forward(out, g, up_r);
      swiglu_backward(dgate, dup, dy, g, up_r);
      Tensor out_t = Tensor::empty({N, H}, dt), dgate_t = Tensor::empty({N, H}, dt), dup_t = Tensor::empty({N, H}, dt);
      swiglu_forward(out_t, convert(g, dt), convert(up_r, dt));
      swiglu_backward(dgate_t, dup_t, convert(dy, dt), convert(g, dt), convert(up_r, dt));
      // e32: exp within a few ulp, then 3-4 roundings: ~1e-6 relative. The gate's derivative factor
      // 1 + g (1 - s) cancels near g = -1.28; there its fp32 error is ~u32 |g| |dout up| absolute, < 1e-5.
      REQUIRE(max_err(out_t, out, u + 1e-6, subnormal_slack(dt)) <= 1);
      REQUIRE(max_err(dgate_t, dgate, u + 1e-6, 1e-5 + subnormal_slack(dt)) <= 1);
      REQUIRE(max_err(dup_t, dup, u + 1e-6, subnormal_slack(dt)) <= 1);
      if (dt == DType::F32) continue;
      // A 16-bit kernel runs the fp32 kernel's arithmetic on the widened values and rounds once: its outputs are
      // the fp32 kernel's, rounded, bit for bit.
      const DType f32 = DType::F32;
      Tensor out32 = Tensor::empty({N, H}, f32), dgate32 = Tensor::empty({N, H}, f32);
      Tensor dup32 = Tensor::empty({N, H}, f32);
      swiglu_forward(out32, convert(g, f32), convert(up_r, f32));
      swiglu_backward(dgate32, dup32, convert(dy, f32), convert(g, f32), convert(up_r, f32));
      REQUIRE(same_bits(out_t, convert(out32, dt)));
      REQUIRE(same_bits(dgate_t, convert(dgate32, dt)));
      REQUIRE(same_bits(dup_t, convert(dup32, dt)));
    }
  }
}

// ---------------------------------------------------------------------------------- grouped-query attention

namespace {

// Row n of the [N, width] tensor t (fp64).
const double* row(const Tensor& t, int64_t n, int64_t width) { return d(t) + n * width; }

}  // namespace

TEST_CASE("gqa: expansion by hand, gradients, overwrite", "[gqa]") {
  // 6 query heads on 2 kv heads (groups of 3: head h uses kv head h / 3, which h % 2 would not give), and
  // multi-query attention (1 kv head).
  for (auto [NH, KV] : {std::pair<int, int>{6, 2}, {4, 1}}) {
    INFO("n_head " << NH << " n_kv_head " << KV);
    const int HS = 4;
    const int64_t N = 6, QW = NH * HS, KW = KV * HS, WF = 3 * QW;
    Tensor q = f64({2, 3, QW}), k = f64({2, 3, KW}), v = f64({2, 3, KW}), full = f64({2, 3, WF});
    Tensor proj = f64({2, 3, WF});
    fill_normal(q, 1), fill_normal(k, 2), fill_normal(v, 3), fill_normal(proj, 4);
    auto loss = [&] {
      gqa_expand(full, q, k, v, NH, KV, HS);
      return dot(full, proj);
    };
    loss();
    const int group = NH / KV;
    for (int64_t n = 0; n < N; ++n)
      for (int h = 0; h < NH; ++h)
        for (int i = 0; i < HS; ++i) {
          const double* dst = row(full, n, WF);
          REQUIRE(dst[h * HS + i] == row(q, n, QW)[h * HS + i]);
          REQUIRE(dst[QW + h * HS + i] == row(k, n, KW)[(h / group) * HS + i]);
          REQUIRE(dst[2 * QW + h * HS + i] == row(v, n, KW)[(h / group) * HS + i]);
        }
    Tensor dq = f64({2, 3, QW}), dk = f64({2, 3, KW}), dv = f64({2, 3, KW});
    fill_normal(dq, 5, 100.0), fill_normal(dk, 6, 100.0), fill_normal(dv, 7, 100.0);  // overwritten: garbage
    gqa_reduce(dq, dk, dv, proj, NH, KV, HS);
    gradcheck(loss, {{"q", q, dq}, {"k", k, dk}, {"v", v, dv}});
  }
}

TEST_CASE("gqa: reducing an expanded ones tensor counts each group, and equal head counts copy", "[gqa]") {
  const int HS = 8;
  for (DType dt : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
    INFO(dtype_name(dt));
    {
      const int NH = 8, KV = 2;  // groups of 4
      const int64_t N = 5, QW = NH * HS, KW = KV * HS;
      auto ones = [&](int64_t width) {
        Tensor t = f64({N, width});
        for (int64_t i = 0; i < t.numel(); ++i) d(t)[i] = 1;
        return convert(t, dt);
      };
      Tensor full = Tensor::empty({N, 3 * QW}, dt);
      gqa_expand(full, ones(QW), ones(KW), ones(KW), NH, KV, HS);
      Tensor dq = Tensor::empty({N, QW}, dt), dk = Tensor::empty({N, KW}, dt), dv = Tensor::empty({N, KW}, dt);
      gqa_reduce(dq, dk, dv, full, NH, KV, HS);
      const Tensor outs[] = {dq, dk, dv};
      for (int p = 0; p < 3; ++p) {
        const Tensor b = to64(outs[p]);
        const double want = p == 0 ? 1.0 : double(NH / KV);  // dq copied; each kv head summed over its group
        for (int64_t i = 0; i < b.numel(); ++i) REQUIRE(d(b)[i] == want);
      }
    }
    {
      const int NH = 3;  // n_kv_head == n_head: the expansion concatenates, the reduction splits, bit for bit
      const int64_t N = 4, C = NH * HS;
      Tensor x64 = f64({N, 3 * C});
      fill_normal(x64, 1);
      const Tensor x = convert(x64, dt);
      const size_t es = dtype_size(dt);
      Tensor q = Tensor::empty({N, C}, dt), k = Tensor::empty({N, C}, dt), v = Tensor::empty({N, C}, dt);
      const Tensor parts[] = {q, k, v};
      for (int64_t n = 0; n < N; ++n)  // x's rows are q | k | v
        for (int p = 0; p < 3; ++p)
          std::memcpy(static_cast<char*>(parts[p].data()) + n * C * es,
                      static_cast<const char*>(x.data()) + (n * 3 + p) * C * es, C * es);
      Tensor full = Tensor::empty({N, 3 * C}, dt);
      gqa_expand(full, q, k, v, NH, NH, HS);
      REQUIRE(same_bits(full, x));
      Tensor dq = Tensor::empty({N, C}, dt), dk = Tensor::empty({N, C}, dt), dv = Tensor::empty({N, C}, dt);
      gqa_reduce(dq, dk, dv, x, NH, NH, HS);
      REQUIRE(same_bits(dq, q));
      REQUIRE(same_bits(dk, k));
      REQUIRE(same_bits(dv, v));
    }
  }
}

TEST_CASE("gqa: fp32, bf16 and fp16 against fp64", "[gqa]") {
  // N * 3 * NH * HS = 98304 takes the multithreaded path.
  const int NH = 8, KV = 2, HS = 16;
  const int64_t N = 256, QW = NH * HS, KW = KV * HS, WF = 3 * QW;
  Tensor q64 = f64({N, QW}), k64 = f64({N, KW}), v64 = f64({N, KW}), dfull = f64({N, WF});
  fill_normal(q64, 1), fill_normal(k64, 2), fill_normal(v64, 3), fill_normal(dfull, 4);
  for (DType dt : kReducedDtypes) {
    INFO(dtype_name(dt));
    const Tensor q = convert(q64, dt), k = convert(k64, dt), v = convert(v64, dt), df = convert(dfull, dt);
    Tensor full = Tensor::empty({N, WF}, dt), ref_full = f64({N, WF});
    gqa_expand(full, q, k, v, NH, KV, HS);
    gqa_expand(ref_full, to64(q), to64(k), to64(v), NH, KV, HS);
    REQUIRE(same_bits(full, convert(ref_full, dt)));  // element copies: exact
    Tensor dq = Tensor::empty({N, QW}, dt), dk = Tensor::empty({N, KW}, dt), dv = Tensor::empty({N, KW}, dt);
    Tensor rq = f64({N, QW}), rk = f64({N, KW}), rv = f64({N, KW});
    gqa_reduce(dq, dk, dv, df, NH, KV, HS);
    gqa_reduce(rq, rk, rv, to64(df), NH, KV, HS);
    REQUIRE(same_bits(dq, convert(rq, dt)));  // copies of dq: exact
    // Sums of 4 values in fp32 (<= 3 u32 of the sum of magnitudes, < 1e-6 absolute for N(0, 1) values), then one
    // rounding.
    REQUIRE(max_err(dk, rk, unit_roundoff(dt), 1e-6 + subnormal_slack(dt)) <= 1);
    REQUIRE(max_err(dv, rv, unit_roundoff(dt), 1e-6 + subnormal_slack(dt)) <= 1);
    if (dt == DType::F32) continue;
    // The 16-bit sums are the fp32 kernel's sums (the same order), rounded once: bit for bit.
    const DType f32 = DType::F32;
    Tensor q32 = Tensor::empty({N, QW}, f32), k32 = Tensor::empty({N, KW}, f32), v32 = Tensor::empty({N, KW}, f32);
    gqa_reduce(q32, k32, v32, convert(df, f32), NH, KV, HS);
    REQUIRE(same_bits(dk, convert(k32, dt)));
    REQUIRE(same_bits(dv, convert(v32, dt)));
  }
}

TEST_CASE("gqa: separate inputs may overlap one another, outputs may not overlap anything", "[gqa]") {
  const int NH = 4, KV = 2, HS = 4;
  const int64_t N = 3, QW = NH * HS, KW = KV * HS, WF = 3 * QW;
  // k and v one tensor: only read, so allowed; the expansion's k and v parts are then equal.
  Tensor q = f64({N, QW}), kv = f64({N, KW}), full = f64({N, WF});
  fill_normal(q, 1), fill_normal(kv, 2);
  gqa_expand(full, q, kv, kv, NH, KV, HS);
  for (int64_t n = 0; n < N; ++n)
    REQUIRE(std::memcmp(row(full, n, WF) + QW, row(full, n, WF) + 2 * QW, QW * sizeof(double)) == 0);

  // One buffer holding [q | k | v | full] back to back, and views that overlap a neighbour.
  const int64_t total = N * (QW + 2 * KW + WF);
  Tensor buf = f64({total + 1});
  fill_normal(buf, 3);
  const Tensor bq = buf.slice(0, {N, QW}), bk = buf.slice(N * QW, {N, KW}), bv = buf.slice(N * (QW + KW), {N, KW});
  const Tensor bfull = buf.slice(N * (QW + 2 * KW), {N, WF});
  const Tensor shifted_full = buf.slice(N * (QW + 2 * KW) - 1, {N, WF});  // its first element is v's last
  const Tensor shifted_k = buf.slice(N * QW - 1, {N, KW});                // its first element is q's last
  const Tensor shifted_v = buf.slice(N * (QW + KW) - 1, {N, KW});         // its first element is k's last
  struct Case {
    const char* what;
    std::function<void()> call;
    const char* message;
  };
  const Case cases[] = {
      {"qkv_full into v", [&] { gqa_expand(shifted_full, bq, bk, bv, NH, KV, HS); }, "qkv_full overlaps v"},
      {"qkv_full is q's buffer", [&] { gqa_expand(buf.slice(0, {N, WF}), bq, bk, bv, NH, KV, HS); },
       "qkv_full overlaps q"},
      {"dk into dq", [&] { gqa_reduce(bq, shifted_k, bv, bfull, NH, KV, HS); }, "dq overlaps dk"},
      {"dv into dk", [&] { gqa_reduce(bq, bk, shifted_v, bfull, NH, KV, HS); }, "dk overlaps dv"},
      {"dk is dv", [&] { gqa_reduce(bq, bk, bk, bfull, NH, KV, HS); }, "dk overlaps dv"},
      {"dqkv_full into dv", [&] { gqa_reduce(bq, bk, bv, shifted_full, NH, KV, HS); }, "dv overlaps dqkv_full"},
      {"k of q's width", [&] { gqa_expand(full, q, q, kv, NH, KV, HS); }, "k has shape"},
      {"dv of another dtype",
       [&] { gqa_reduce(bq, bk, Tensor::empty({N, KW}, DType::F32), bfull, NH, KV, HS); }, "dv is fp32 but dq is fp64"},
      {"n_head not a multiple", [&] { gqa_expand(full, q, kv, kv, NH, 3, HS); }, "is not a multiple of n_kv_head"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const std::string msg = abort_message(c.call);
    INFO("stderr: " << msg);
    REQUIRE(msg.find(c.message) != std::string::npos);
  }
  // The disjoint views of the buffer are accepted.
  gqa_expand(bfull, bq, bk, bv, NH, KV, HS);
  gqa_reduce(bq, bk, bv, bfull, NH, KV, HS);
}
