// 16-bit storage (bf16, fp16) of attention, softmax cross-entropy and the vocab-parallel cross-entropy steps,
// checked against the fp32 kernels on the SAME inputs: every input is first rounded to the 16-bit format and the
// fp32 reference runs on those values widened back to fp32 (exact), so any difference comes from the 16-bit
// kernel's own roundings. The contract (kernels/cpu/storage.h): values are widened when read, everything is
// computed in fp32, and each stored element is rounded once to nearest even. Where the 16-bit kernel performs
// exactly the fp32 kernel's operations, that makes its outputs the fp32 kernel's outputs rounded once, and the
// tests say so bit for bit; elsewhere the tolerances are derived from the format's unit roundoff u (2^-8 for
// bf16, 2^-11 for fp16) and stated next to each check. Argument dtypes (the accumulation dtype fp32 for losses,
// statistics and attention scratch) are checked in child processes, since failed checks abort.
#include <catch2/catch.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/cpu/tile_gemm_bf16.h"
#include "kernels/crossentropy.h"
#include "kernels/vocab_parallel.h"
#include "test_support.h"

using namespace mt;
using namespace mt::kernels;

namespace {

// A 16-bit format: its dtype, its unit roundoff u (half the spacing of 1's neighbours: |round(x) - x| <= u |x| for
// normal x) and eta, half the spacing of its subnormals (the absolute rounding error below its normal range: fp16
// probabilities under 2^-14 ~ 6e-5 are subnormal; bf16 shares fp32's range, where this never happens here).
struct Format {
  DType dt;
  double u, eta;
};
const Format kFormats[] = {{DType::BF16, std::ldexp(1.0, -8), std::ldexp(1.0, -134)},
                           {DType::F16, std::ldexp(1.0, -11), std::ldexp(1.0, -25)}};
// fp32's unit roundoff: the scale of the fp32 reference's own rounding noise.
const double kU32 = std::ldexp(1.0, -24);

Tensor f32(Shape s) { return Tensor::empty(s, DType::F32); }

Tensor convert(const Tensor& t, DType dt) {
  Tensor r = Tensor::empty(t.shape(), dt);
  copy_convert(r, t);
  return r;
}
Tensor clone(const Tensor& t) { return convert(t, t.dtype()); }

// An fp32 tensor of N(0, scale^2) values.
Tensor normal32(Shape s, uint64_t seed, double scale = 1.0) {
  Tensor t = f32(s);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = float(scale * nd(rng));
  return t;
}

// Any float tensor's values as doubles (exact).
std::vector<double> values(const Tensor& t) {
  Tensor d = convert(t, DType::F64);
  return std::vector<double>(d.data_as<double>(), d.data_as<double>() + d.numel());
}

// x rounded once (to nearest even) to dt, as a double (exact).
double round_to(double x, DType dt) {
  Tensor a = Tensor::empty({1}, DType::F64), b = Tensor::empty({1}, dt);
  a.data_as<double>()[0] = x;
  copy_convert(b, a);
  return values(b)[0];
}

// Every element of x16 is the corresponding fp32 element of ref rounded once to x16's dtype (bit for bit, +0/-0
// aside). Returns the number of mismatches; reports the first.
int64_t mismatches_rounded(const Tensor& x16, const Tensor& ref32) {
  REQUIRE(x16.numel() == ref32.numel());
  const Tensor r = convert(ref32, x16.dtype());  // copy_convert rounds fp32 -> 16-bit to nearest even
  const std::vector<double> a = values(x16), b = values(r), c = values(ref32);
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i])) {
      if (bad++ == 0) UNSCOPED_INFO("element " << i << ": " << a[i] << ", expected round(" << c[i] << ") = " << b[i]);
    }
  return bad;
}

// Bitwise equal values (NaN-free).
int64_t mismatches(const Tensor& a, const Tensor& b) {
  REQUIRE(a.numel() == b.numel());
  const std::vector<double> x = values(a), y = values(b);
  int64_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (!(x[i] == y[i])) {
      if (bad++ == 0) UNSCOPED_INFO("element " << i << ": " << x[i] << " != " << y[i]);
    }
  return bad;
}

bool any_nan(const Tensor& t) {
  for (double x : values(t))
    if (std::isnan(x)) return true;
  return false;
}

// Runs f in a child process; f must fail a CHECK (abort). Returns what the child wrote to stderr.
std::string check_failure(const std::function<void()>& f) {
  std::fflush(nullptr);
  int fd[2];
  REQUIRE(::pipe(fd) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::signal(SIGABRT, SIG_DFL);  // not Catch2's fatal-signal handler: the child must just die
    ::close(fd[0]);
    ::dup2(fd[1], 2);
    if (!std::freopen("/dev/null", "w", stdout)) ::_exit(3);
    f();
    ::_exit(0);
  }
  ::close(fd[1]);
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = ::read(fd[0], buf, sizeof buf)) > 0;) msg.append(buf, size_t(n));
  ::close(fd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  INFO("child stderr: " << msg);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGABRT);
  return msg;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Whether this build's CPU attention runs dt on the bf16 pair tiles (AVX512-BF16; kernels/cpu/tile_gemm_bf16.h):
// products of bf16 operands in another order than the fp32 kernel's, and dS rounded to bf16 as on the GPU.
bool on_pair_tiles(DType dt) { return dt == DType::BF16 && kernels::cpu::pair_tile::kPairTiles; }

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Attention.

// Forward. With qkv the same values, the 16-bit kernel computes the scores and softmax with the fp32 kernel's
// operations on 64-byte-aligned rows (T * 4 bytes a multiple of 64, as here), so its probabilities are the fp32
// kernel's bit for bit, and att holds them rounded once: att16 == round(att32), exactly (zeros above the
// diagonal included). out is then sum_j att16_ij v_j in fp32, rounded once: it must be a rounding of the exact
// sum (computed here in fp64) up to fp32 accumulation noise e = T u32 sum_j att16_ij |v_j| (a T-term dot product's
// error bound): round(ref - e) <= out16 <= round(ref + e). A kernel that multiplied by the unrounded
// probabilities (off by up to u sum_j p_j |v_j|) or rounded P V twice fails this bracket.
// Against the fp32 kernel's out: the weights differ by |att16 - p| <= u p + eta, so the products differ by at most
// u sum_j p_j |v_j| + eta sum_j |v_j|, plus the final rounding u |out| and both sides' fp32 noise:
//   |out16 - out32| <= u |out32| + (1 + u) (u sum_j p_j |v_j| + eta sum_j |v_j|) + 2 T u32 sum_j p_j |v_j|.
// Shapes: {B 4, T 48, C 128, NH 4} runs the (batch, head) loop multithreaded; {B 3, T 33, C 64, NH 4} has rows
// that are not whole vectors. Both formats compute the scores and the softmax on the same fp32 scratch rows, so
// att16 is att32 rounded once, bit for bit, at both; except bf16 on the pair tiles, whose scores are fp32 sums of
// the same exact products in another order (off by ~HS u32 relative): there att16 is one of att32's two bf16
// neighbours (|att16 - att32| <= 2u att32), and the weights' term of the second bound doubles to 2u.
TEST_CASE("attention 16-bit: forward against fp32 on the same inputs", "[attention][precision]") {
  struct Dims {
    int64_t B, T, C, NH;
  };
  for (const Dims& dm : {Dims{4, 48, 128, 4}, Dims{3, 33, 64, 4}}) {
    const int64_t B = dm.B, T = dm.T, C = dm.C, NH = dm.NH, HS = C / NH;
    for (const Format& f : kFormats) {
      INFO(dtype_name(f.dt) << ", T " << T);
      const Tensor qkv16 = convert(normal32({B, T, 3 * C}, 1), f.dt), qkv = convert(qkv16, DType::F32);
      Tensor out16 = Tensor::empty({B, T, C}, f.dt), att16 = Tensor::empty({B, NH, T, T}, f.dt);
      attention_forward(out16, att16, qkv16, int(NH));
      Tensor out32 = f32({B, T, C}), att32 = f32({B, NH, T, T});
      attention_forward(out32, att32, qkv, int(NH));

      const std::vector<double> a16 = values(att16), a32 = values(att32), o16 = values(out16), o32 = values(out32),
                                x = values(qkv);
      const bool pairs = on_pair_tiles(f.dt);
      if (pairs) {
        for (size_t i = 0; i < a16.size(); ++i) {
          INFO("att element " << i << ": " << a16[i] << " against fp32's " << a32[i]);
          REQUIRE(std::abs(a16[i] - a32[i]) <= 2 * f.u * a32[i]);
        }
      } else {
        REQUIRE(mismatches_rounded(att16, att32) == 0);
      }
      const double uw = pairs ? 2 * f.u : f.u;  // the weights' rounding against fp32's probabilities
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < NH; ++h)
          for (int64_t i = 0; i < T; ++i)
            for (int64_t k = 0; k < HS; ++k) {
              double ref = 0, mag16 = 0, mag32 = 0, vsum = 0;
              for (int64_t j = 0; j <= i; ++j) {
                const double v = x[(b * T + j) * 3 * C + 2 * C + h * HS + k];
                const double p16 = a16[((b * NH + h) * T + i) * T + j], p32 = a32[((b * NH + h) * T + i) * T + j];
                ref += p16 * v, mag16 += p16 * std::abs(v), mag32 += p32 * std::abs(v), vsum += std::abs(v);
              }
              const int64_t o = (b * T + i) * C + h * HS + k;
              INFO("out[" << b << ", " << i << ", " << h * HS + k << "] = " << o16[o] << ", sum att16 v = " << ref);
              const double e = double(T) * kU32 * mag16;
              REQUIRE(o16[o] >= round_to(ref - e, f.dt));
              REQUIRE(o16[o] <= round_to(ref + e, f.dt));
              const double tol =
                  f.u * std::abs(o32[o]) + (1 + f.u) * (uw * mag32 + f.eta * vsum) + 2 * double(T) * kU32 * mag32;
              REQUIRE(std::abs(o16[o] - o32[o]) <= tol);
            }
    }
  }
}

// Backward. The inputs of the backward pass are dout, qkv and att; the fp32 kernel gets them all widened from the
// 16-bit tensors (att: the probabilities the 16-bit forward stored). The 16-bit kernel runs the fp32 kernel's
// products on the same fp32 copies of the operands (the fp32 kernel copies them too), keeps dP and dS in fp32
// exactly as the fp32 kernel does, and rounds each of dq, dk, dv once. So, bit for bit: dqkv16 == round(dqkv32).
// Computing dS in 16 bits, or rounding an intermediate, changes these values by ~u relative and fails.
// bf16 on the pair tiles rounds dS to bf16 before dQ = dS K and dK = dS^T Q, as the GPU's tensor-core kernel
// does, and is checked against fp64 sums of the same inputs instead (pair_tiles_backward_bounds).
// The pair tiles' backward against fp64 on the same 16-bit inputs (P = att16, exact). dv = P^T dO is an fp32 sum
// of exact products, rounded once: round(ref - e) <= dv16 <= round(ref + e), e = T u32 sum_i P_ij |dO_ik|, as
// for the forward's out. dQ = dS K and dK = dS^T Q: the kernel's dS carries fp32 noise delta (from dP, an HS-term
// sum, D_i = sum_l P_il dP_il, a T-term sum, and three roundings), bounded per element by
//   delta_ij = scale P_ij (HS u32 M_ij + T u32 sum_l P_il |dP_il| + HS u32 sum_l P_il M_il) + 3 u32 |dS_ij|,
// M_ij = sum_k |dO_ik| |V_jk|; then the rounding to bf16 (u (|dS| + delta)), the T-term fp32 sum and the final
// rounding: |dq16 - sum_j dS_ij K_jk| <= u |ref| + (1 + u) ((u + 2 T u32) S + sum_j delta_ij |K_jk|), with
// S = sum_j (|dS_ij| + delta_ij) |K_jk|; dk alike over i with Q. One dS term dropped or a pair misplaced moves
// a value by a whole |dS_ij K_jk|, far past u S.
void pair_tiles_backward_bounds(const Tensor& dqkv16, const Tensor& dout16, const Tensor& qkv16, const Tensor& att16,
                                int64_t B, int64_t T, int64_t C, int64_t NH, const Format& f) {
  const int64_t HS = C / NH;
  const double scale = 1.0 / std::sqrt(double(HS)), u = f.u;
  const std::vector<double> g = values(dqkv16), dO = values(dout16), x = values(qkv16), P = values(att16);
  // Element (b, t, h, k) of q (part 0), k (1) or v (2), in qkv and in its gradient.
  auto index = [&](int64_t b, int64_t t, int part, int64_t h, int64_t k) {
    return (b * T + t) * 3 * C + part * C + h * HS + k;
  };
  auto at = [&](int64_t b, int64_t t, int part, int64_t h, int64_t k) { return x[index(b, t, part, h, k)]; };
  auto grad = [&](int64_t b, int64_t t, int part, int64_t h, int64_t k) { return g[index(b, t, part, h, k)]; };
  auto bracket = [&](double got, double ref, double e, const char* what) {
    INFO(what << " = " << got << ", exact " << ref << " +- " << e);
    REQUIRE(got >= round_to(ref - e, f.dt));
    REQUIRE(got <= round_to(ref + e, f.dt));
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      auto p = [&](int64_t i, int64_t j) { return P[((b * NH + h) * T + i) * T + j]; };
      auto dout = [&](int64_t i, int64_t k) { return dO[(b * T + i) * C + h * HS + k]; };
      std::vector<double> dP(T * T, 0.0), M(T * T, 0.0), dS(T * T, 0.0), delta(T * T, 0.0);
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t k = 0; k < HS; ++k) {
            dP[i * T + j] += dout(i, k) * at(b, j, 2, h, k);
            M[i * T + j] += std::abs(dout(i, k) * at(b, j, 2, h, k));
          }
      for (int64_t i = 0; i < T; ++i) {
        double D = 0, PdP = 0, PM = 0;
        for (int64_t l = 0; l <= i; ++l)
          D += p(i, l) * dP[i * T + l], PdP += p(i, l) * std::abs(dP[i * T + l]), PM += p(i, l) * M[i * T + l];
        for (int64_t j = 0; j <= i; ++j) {
          dS[i * T + j] = p(i, j) * (dP[i * T + j] - D) * scale;
          delta[i * T + j] = scale * p(i, j) * (double(HS) * kU32 * M[i * T + j] + double(T) * kU32 * PdP +
                                                double(HS) * kU32 * PM) + 3 * kU32 * std::abs(dS[i * T + j]);
        }
      }
      for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < HS; ++k) {
          double dv = 0, ev = 0, dq = 0, sq = 0, dq_delta = 0, dk = 0, sk = 0, dk_delta = 0;
          for (int64_t i = t; i < T; ++i) {  // t as a key: dv and dk sum over the queries i >= t
            dv += p(i, t) * dout(i, k), ev += std::abs(p(i, t) * dout(i, k));
            const double q = at(b, i, 0, h, k);
            dk += dS[i * T + t] * q, sk += (std::abs(dS[i * T + t]) + delta[i * T + t]) * std::abs(q);
            dk_delta += delta[i * T + t] * std::abs(q);
          }
          for (int64_t j = 0; j <= t; ++j) {  // t as a query: dq sums over the keys j <= t
            const double kv = at(b, j, 1, h, k);
            dq += dS[t * T + j] * kv, sq += (std::abs(dS[t * T + j]) + delta[t * T + j]) * std::abs(kv);
            dq_delta += delta[t * T + j] * std::abs(kv);
          }
          bracket(grad(b, t, 2, h, k), dv, double(T) * kU32 * ev, "dv");
          const double tq = u * std::abs(dq) + (1 + u) * ((u + 2 * double(T) * kU32) * sq + dq_delta);
          const double tk = u * std::abs(dk) + (1 + u) * ((u + 2 * double(T) * kU32) * sk + dk_delta);
          INFO("dq = " << grad(b, t, 0, h, k) << ", exact " << dq << " +- " << tq);
          REQUIRE(std::abs(grad(b, t, 0, h, k) - dq) <= tq);
          INFO("dk = " << grad(b, t, 1, h, k) << ", exact " << dk << " +- " << tk);
          REQUIRE(std::abs(grad(b, t, 1, h, k) - dk) <= tk);
        }
    }
}

TEST_CASE("attention 16-bit: backward against fp32 on the same inputs", "[attention][precision]") {
  struct Dims {
    int64_t B, T, C, NH;
  };
  for (const Dims& dm : {Dims{4, 48, 128, 4}, Dims{3, 33, 64, 4}}) {
    const int64_t B = dm.B, T = dm.T, C = dm.C, NH = dm.NH;
    for (const Format& f : kFormats) {
      INFO(dtype_name(f.dt) << ", T " << T);
      const Tensor qkv16 = convert(normal32({B, T, 3 * C}, 1), f.dt), dout16 = convert(normal32({B, T, C}, 2), f.dt);
      Tensor out16 = Tensor::empty({B, T, C}, f.dt), att16 = Tensor::empty({B, NH, T, T}, f.dt);
      attention_forward(out16, att16, qkv16, int(NH));
      Tensor dqkv16 = convert(normal32({B, T, 3 * C}, 3, 100.0), f.dt);  // overwritten
      Tensor datt16 = normal32({B, NH, T, T}, 4, 100.0);                  // scratch, fp32
      attention_backward(dqkv16, datt16, dout16, qkv16, out16, att16, int(NH));

      Tensor dqkv32 = f32({B, T, 3 * C}), datt32 = f32({B, NH, T, T});
      attention_backward(dqkv32, datt32, convert(dout16, DType::F32), convert(qkv16, DType::F32),
                         convert(out16, DType::F32), convert(att16, DType::F32), int(NH));
      REQUIRE(!any_nan(dqkv32));
      if (on_pair_tiles(f.dt))
        pair_tiles_backward_bounds(dqkv16, dout16, qkv16, att16, B, T, C, NH, f);
      else
        REQUIRE(mismatches_rounded(dqkv16, dqkv32) == 0);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Softmax cross-entropy.

// The 16-bit kernel widens each row into a 64-byte-aligned fp32 buffer and runs the fp32 kernel's code on it, so
// with 64-byte-aligned rows (Vp a multiple of 16, as here) max, exp, sum and loss are the fp32 kernel's bit for
// bit: losses (fp32) equal the fp32 kernel's exactly, and dlogits16 == round(dlogits32) exactly, padding columns
// 0, whether dlogits is a separate tensor, aliases the logits, or is absent (losses only). A softmax or loss
// computed in 16 bits is off by ~u |loss| (~1e-2 here) and fails; so does a wrongly rounded gradient.
// Padding columns hold NaN in both runs: they must reach neither the loss nor the gradient.
TEST_CASE("softmax_xent 16-bit: losses exactly fp32's, dlogits the fp32 gradient rounded once",
          "[crossentropy][precision]") {
  const int64_t N = 64, Vp = 1024, vocab = 1000;  // N Vp > kParallelGrain: rows split across threads
  const double dloss = 1.0 / N;
  Tensor targets = Tensor::empty({N}, DType::I32);
  for (int64_t n = 0; n < N; ++n) targets.data_as<int32_t>()[n] = int32_t((n * 37) % vocab);
  Tensor logits32 = normal32({N, Vp}, 5, 3.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = vocab; v < Vp; ++v)
      logits32.data_as<float>()[n * Vp + v] = std::numeric_limits<float>::quiet_NaN();
  for (const Format& f : kFormats) {
    INFO(dtype_name(f.dt));
    const Tensor lg16 = convert(logits32, f.dt), lg = convert(lg16, DType::F32);
    // Reference: the fp32 kernel on the widened logits.
    Tensor ref_l = f32({N}), ref_d = f32({N, Vp}), ref_l_only = f32({N});
    softmax_xent_forward_backward(ref_l, ref_d, lg, targets, vocab, dloss);
    softmax_xent_forward_backward(ref_l_only, Tensor(), lg, targets, vocab, dloss);
    REQUIRE(!any_nan(ref_l));
    REQUIRE(!any_nan(ref_d));

    Tensor l16 = f32({N}), d16 = convert(normal32({N, Vp}, 6, 100.0), f.dt);  // overwritten, padding included
    softmax_xent_forward_backward(l16, d16, lg16, targets, vocab, dloss);
    REQUIRE(mismatches(l16, ref_l) == 0);
    REQUIRE(mismatches_rounded(d16, ref_d) == 0);  // padding: ref_d is 0 there, so d16 must be 0 too

    Tensor inplace = clone(lg16), l_in = f32({N});
    softmax_xent_forward_backward(l_in, inplace, inplace, targets, vocab, dloss);
    REQUIRE(mismatches(l_in, ref_l) == 0);
    REQUIRE(mismatches(inplace, d16) == 0);

    Tensor l_only = f32({N});
    softmax_xent_forward_backward(l_only, Tensor(), lg16, targets, vocab, dloss);
    REQUIRE(mismatches(l_only, ref_l_only) == 0);
  }
}

// Rows that are not 64-byte aligned (Vp = 1003): the fp32 kernel's vectorised exp and sum then split its rows
// differently from the 16-bit kernel's aligned buffer, so the two fp32 computations differ by reassociation
// only. Bound: two orders of a sum of n = vocab positive terms differ by at most 2 n u32 relative (gamma_n each
// way), and exp's scalar and vector forms by a few ulp: eps = (2 vocab + 4) u32 (~1.2e-4, a rigorous bound; in
// practice ~1e-6). So |loss16 - loss32| <= eps (log of a relative change eps), and
//   |d16 - d32| <= u |d32| (1 + eps) + eps (|d32| + dloss [v == target]) + eta
// (the probability changes by eps relative, times dloss; at the target p dloss - dloss; then one rounding).
TEST_CASE("softmax_xent 16-bit: unaligned rows agree with fp32 within reassociation noise",
          "[crossentropy][precision]") {
  const int64_t N = 24, Vp = 1003, vocab = 1000;
  const double dloss = 0.37, eps = (2.0 * vocab + 4) * kU32;
  Tensor targets = Tensor::empty({N}, DType::I32);
  for (int64_t n = 0; n < N; ++n) targets.data_as<int32_t>()[n] = int32_t((n * 41 + 3) % vocab);
  const Tensor logits32 = normal32({N, Vp}, 7, 3.0);
  for (const Format& f : kFormats) {
    INFO(dtype_name(f.dt));
    const Tensor lg16 = convert(logits32, f.dt);
    Tensor ref_l = f32({N}), ref_d = f32({N, Vp}), l16 = f32({N}), d16 = Tensor::empty({N, Vp}, f.dt);
    softmax_xent_forward_backward(ref_l, ref_d, convert(lg16, DType::F32), targets, vocab, dloss);
    softmax_xent_forward_backward(l16, d16, lg16, targets, vocab, dloss);
    const std::vector<double> a = values(l16), b = values(ref_l), x = values(d16), y = values(ref_d);
    for (int64_t n = 0; n < N; ++n) REQUIRE(std::abs(a[n] - b[n]) <= eps);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t v = 0; v < Vp; ++v) {
        const int64_t i = n * Vp + v;
        const double at_target = v == targets.data_as<int32_t>()[n] ? dloss : 0.0;
        INFO("dlogits[" << n << ", " << v << "] = " << x[i] << ", fp32 " << y[i]);
        if (v >= vocab) REQUIRE(x[i] == 0.0);
        const double tol = f.u * std::abs(y[i]) * (1 + eps) + eps * (std::abs(y[i]) + at_target) + f.eta;
        REQUIRE(std::abs(x[i] - y[i]) <= tol);
      }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Vocab-parallel cross-entropy.

namespace {

struct Sharded {
  Tensor losses;
  std::vector<Tensor> local_max, local_stats, global_max, global_stats;
};

// Column shards of a [N, Vp] tensor (any dtype, copied exactly): shard r holds columns [r Vl, (r + 1) Vl).
std::vector<Tensor> split_columns(const Tensor& full, int tp) {
  const int64_t N = full.dim(0), Vp = full.dim(1), Vl = Vp / tp;
  REQUIRE(Vl * tp == Vp);
  const size_t es = dtype_size(full.dtype());
  std::vector<Tensor> shards;
  for (int r = 0; r < tp; ++r) {
    Tensor s = Tensor::empty({N, Vl}, full.dtype());
    for (int64_t n = 0; n < N; ++n)
      std::memcpy(static_cast<char*>(s.data()) + n * Vl * es,
                  static_cast<const char*>(full.data()) + (n * Vp + r * Vl) * es, Vl * es);
    shards.push_back(s);
  }
  return shards;
}

// The three steps on every shard, with the tp all-reduces done by hand (elementwise max, then sum in rank order)
// on the fp32 row_max and stats, as the model runs them. dshards: empty (losses only) or one gradient tensor per
// shard (possibly the shards themselves: in place). Every rank's losses must be identical.
Sharded run_sharded(const std::vector<Tensor>& shards, const std::vector<Tensor>& dshards, const Tensor& targets,
                    int64_t vocab, double dloss) {
  const int tp = int(shards.size());
  const int64_t N = shards[0].dim(0), Vl = shards[0].dim(1);
  Sharded out;
  std::vector<Tensor> mx, st;
  for (int r = 0; r < tp; ++r) {
    mx.push_back(f32({N}));
    vocab_parallel_xent_local_max(mx[r], shards[r], r * Vl, vocab);
    out.local_max.push_back(clone(mx[r]));
  }
  auto reduce = [](const std::vector<Tensor>& bufs, bool max) {
    for (int64_t i = 0; i < bufs[0].numel(); ++i) {
      float acc = bufs[0].data_as<float>()[i];
      for (size_t r = 1; r < bufs.size(); ++r) {
        const float x = bufs[r].data_as<float>()[i];
        acc = max ? std::max(acc, x) : acc + x;
      }
      for (const Tensor& b : bufs) b.data_as<float>()[i] = acc;
    }
  };
  reduce(mx, true);
  for (int r = 0; r < tp; ++r) {
    st.push_back(f32({2, N}));
    vocab_parallel_xent_local_sums(st[r], shards[r], targets, mx[r], r * Vl, vocab);
    out.local_stats.push_back(clone(st[r]));
  }
  reduce(st, false);
  for (int r = 0; r < tp; ++r) {
    Tensor losses = f32({N});
    vocab_parallel_xent_finish(losses, dshards.empty() ? Tensor() : dshards[r], shards[r], targets, mx[r], st[r],
                               r * Vl, vocab, dloss);
    if (r == 0) out.losses = losses;
    else REQUIRE(mismatches(losses, out.losses) == 0);
  }
  out.global_max = mx, out.global_stats = st;
  return out;
}

}  // namespace

// Each step's 16-bit kernel widens the row's real columns into a 64-byte-aligned fp32 buffer and runs the fp32
// kernel's code on it (shards here are 1024 / tp columns wide: aligned rows). So against the fp32 steps on the
// widened shards, bit for bit: every rank's local row_max and stats (fp32; max and sums never rounded to 16 bits),
// the reduced values, the losses, and dlogits16 == round(dlogits32) (padding 0), separate or in place. Any 16-bit
// rounding of the max, sums or loss, or a wrongly rounded gradient, fails. The padding (global columns >= vocab:
// the tail of the last shard for tp 1 and 2, the last shard partly for tp 4) holds NaN and must not matter.
TEST_CASE("vocab_parallel_xent 16-bit: tp = 1, 2, 4 match the fp32 steps on the same inputs",
          "[vocab_parallel][precision]") {
  const int64_t N = 32, Vp = 1024, vocab = 1000;
  const double dloss = 0.37;
  Tensor targets = Tensor::empty({N}, DType::I32);
  for (int64_t n = 0; n < N; ++n) targets.data_as<int32_t>()[n] = int32_t((n * 61 + 7) % vocab);
  targets.data_as<int32_t>()[0] = int32_t(vocab - 1), targets.data_as<int32_t>()[1] = 0;
  Tensor logits32 = normal32({N, Vp}, 8, 3.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = vocab; v < Vp; ++v)
      logits32.data_as<float>()[n * Vp + v] = std::numeric_limits<float>::quiet_NaN();
  for (const Format& f : kFormats) {
    const Tensor lg16 = convert(logits32, f.dt), lg = convert(lg16, DType::F32);
    for (int tp : {1, 2, 4}) {
      INFO(dtype_name(f.dt) << ", tp " << tp);
      const std::vector<Tensor> s16 = split_columns(lg16, tp), s32 = split_columns(lg, tp);
      std::vector<Tensor> d16, d32;
      for (const Tensor& s : s16) d16.push_back(convert(normal32(s.shape(), 9, 100.0), f.dt));  // overwritten
      for (const Tensor& s : s32) d32.push_back(f32(s.shape()));
      const Sharded a = run_sharded(s16, d16, targets, vocab, dloss);
      const Sharded b = run_sharded(s32, d32, targets, vocab, dloss);
      for (int r = 0; r < tp; ++r) {
        REQUIRE(mismatches(a.local_max[r], b.local_max[r]) == 0);
        REQUIRE(mismatches(a.local_stats[r], b.local_stats[r]) == 0);
        REQUIRE(mismatches_rounded(d16[r], d32[r]) == 0);
      }
      REQUIRE(!any_nan(a.losses));
      REQUIRE(mismatches(a.losses, b.losses) == 0);

      // In place (dlogits aliasing the logits), and losses only.
      std::vector<Tensor> inplace;
      for (const Tensor& s : s16) inplace.push_back(clone(s));
      const Sharded c = run_sharded(inplace, inplace, targets, vocab, dloss);
      REQUIRE(mismatches(c.losses, b.losses) == 0);
      for (int r = 0; r < tp; ++r) REQUIRE(mismatches(inplace[r], d16[r]) == 0);
      const Sharded e = run_sharded(s16, {}, targets, vocab, dloss);
      REQUIRE(mismatches(e.losses, b.losses) == 0);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Argument dtypes: 16-bit activations take fp32 (their accumulation dtype) losses, statistics and attention
// scratch; a 16-bit or fp64 buffer there is refused with a message naming the expected fp32.
TEST_CASE("16-bit attention and cross-entropy refuse accumulation buffers that are not fp32",
          "[attention][crossentropy][vocab_parallel][precision]") {
  const int64_t N = 4, V = 16;
  const Tensor lg = Tensor::empty({N, V}, DType::BF16), targets = Tensor::empty({N}, DType::I32);
  std::string m = check_failure([&] {
    softmax_xent_forward_backward(Tensor::empty({N}, DType::BF16), Tensor(), lg, targets, V, 1.0);
  });
  CHECK(contains(m, "softmax_xent_forward_backward: losses is bf16, expected fp32"));
  m = check_failure([&] {
    softmax_xent_forward_backward(Tensor::empty({N}, DType::F64), Tensor(), convert(lg, DType::F16), targets, V, 1.0);
  });
  CHECK(contains(m, "losses is fp64, expected fp32 (the accumulation dtype of fp16)"));
  m = check_failure([&] {
    softmax_xent_forward_backward(f32({N}), Tensor::empty({N, V}, DType::F16), lg, targets, V, 1.0);
  });
  CHECK(contains(m, "dlogits is fp16 but logits is bf16"));

  m = check_failure([&] { vocab_parallel_xent_local_max(Tensor::empty({N}, DType::BF16), lg, 0, V); });
  CHECK(contains(m, "vocab_parallel_xent_local_max: row_max is bf16, expected fp32"));
  m = check_failure([&] {
    vocab_parallel_xent_local_sums(Tensor::empty({2, N}, DType::BF16), lg, targets, f32({N}), 0, V);
  });
  CHECK(contains(m, "stats is bf16, expected fp32"));
  m = check_failure([&] {
    vocab_parallel_xent_finish(Tensor::empty({N}, DType::BF16), Tensor(), lg, targets, f32({N}), f32({2, N}), 0, V,
                               1.0);
  });
  CHECK(contains(m, "vocab_parallel_xent_finish: losses is bf16, expected fp32"));

  const int64_t B = 1, T = 4, C = 8, NH = 2;
  const Tensor qkv = Tensor::empty({B, T, 3 * C}, DType::F16), out = Tensor::empty({B, T, C}, DType::F16);
  m = check_failure([&] {
    attention_backward(Tensor::empty({B, T, 3 * C}, DType::F16), Tensor::empty({B, NH, T, T}, DType::F16), out, qkv,
                       out, Tensor::empty({B, NH, T, T}, DType::F16), int(NH));
  });
  CHECK(contains(m, "attention_backward: datt is fp16, expected fp32 (the accumulation dtype of fp16)"));
  m = check_failure([&] { attention_forward(out, Tensor::empty({B, NH, T, T}, DType::F32), qkv, int(NH)); });
  CHECK(contains(m, "attention_forward: att is fp32 but qkv is fp16"));
  m = check_failure([&] {
    attention_forward(Tensor::empty({B, T, C}, DType::I32), Tensor::empty({B, NH, T, T}, DType::I32),
                      Tensor::empty({B, T, 3 * C}, DType::I32), int(NH));
  });
  CHECK(contains(m, "qkv must be fp32, fp64, bf16 or fp16, is int32"));
}
