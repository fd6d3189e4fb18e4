// GPU kernels against their CPU contracts: every kernel but matmul and attention runs on host tensors (the CPU
// kernel, the reference) and on device copies of the same random inputs (never zeros), for fp32, bf16 and fp16
// (and fp64 where the GPU supports it), on odd shapes (N=37, C=72, V=101 padded to 128, unaligned views) and
// GPT-2 shapes (C=768, V=50257 padded to 50304). Outputs the kernels overwrite are poisoned with NaN on the GPU
// first, so an element left unwritten fails; accumulated outputs start from the same random values on both.
//
// Tolerances, and why (rel = relative L2 error ||gpu - cpu|| / ||cpu||):
//  - fp32 (and fp32 statistics/gradients of 16-bit kernels): rel <= 1e-5. Both sides compute in fp32 from the same
//    inputs; they differ in summation order (warp/block trees vs sequential/SIMD), in CUDA's tanhf/expf vs
//    Eigen's (a few ulp) and in FMA contraction: a few ulp per element, ~1e-7..1e-6 in aggregate.
//  - 16-bit outputs are rounded once from fp32 values that differ by those few fp32 ulp, so they round to the same
//    value except near a rounding boundary: >= 99% of elements within 1 ulp of the CPU's, and rel <= 1e-2 (bf16,
//    8 mantissa bits) or 5e-3 (fp16, 11 bits) as a bound on the aggregate.
//  - fp64: rel <= 1e-12 (the same arithmetic in double, summation order only).
//  - Atomics (layernorm dweight/dbias, rmsnorm dweight, embedding dwte) make those sums order-dependent: the fp32
//    relative bound.
//  - Copies and single roundings of identical fp32 sums (embedding forward, add, accumulate, bias_add, the
//    embedding's dwpe, clip_scale, the gqa expansion and reduction) must match exactly.
//  - AdamW and SGD: fp32 state, 3 steps, rel <= 1e-6: the same element formula, FMA contraction aside.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "kernels/adamw.h"
#include "kernels/attention_block.h"
#include "kernels/crossentropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gelu.h"
#include "kernels/gqa.h"
#include "kernels/layernorm.h"
#include "kernels/reduce.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/sgd.h"
#include "kernels/swiglu.h"
#include "kernels/vocab_parallel.h"

using namespace mt;
using namespace mt::kernels;

namespace {

const DType kActivationDtypes[] = {DType::F32, DType::BF16, DType::F16, DType::F64};

// Random normal values (shift + scale * N(0, 1)) rounded into `dtype`, on the host.
Tensor random_host(Shape s, DType dtype, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  Tensor d = Tensor::empty(s, DType::F64);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (int64_t i = 0; i < d.numel(); ++i) d.data_as<double>()[i] = shift + scale * nd(rng);
  Tensor t = Tensor::empty(s, dtype);
  copy_convert(t, d);
  return t;
}

Tensor nan_host(Shape s, DType dtype) {
  Tensor d = Tensor::empty(s, DType::F64);
  for (int64_t i = 0; i < d.numel(); ++i) d.data_as<double>()[i] = std::numeric_limits<double>::quiet_NaN();
  Tensor t = Tensor::empty(s, dtype);
  copy_convert(t, d);
  return t;
}

Tensor clone_host(const Tensor& t) {
  Tensor r = Tensor::empty(t.shape(), t.dtype());
  copy_convert(r, t);
  return r;
}

Tensor upload(const Tensor& h) {
  Tensor d = Tensor::empty(h.shape(), h.dtype(), Device::CUDA);
  copy_convert(d, h);
  return d;
}

// A device tensor of NaNs: the output of an overwrite kernel, so that any element it fails to write fails the test.
Tensor poisoned(Shape s, DType dtype) { return upload(nan_host(s, dtype)); }

std::vector<double> values(const Tensor& t) {
  Tensor h = to_host(t);
  Tensor d = Tensor::empty(h.shape(), DType::F64);
  copy_convert(d, h);
  return std::vector<double>(d.data_as<double>(), d.data_as<double>() + d.numel());
}

uint16_t bits16(const Tensor& h, int64_t i) {
  uint16_t b;
  std::memcpy(&b, static_cast<const char*>(h.data()) + 2 * i, 2);
  return b;
}

// ||got - ref|| / ||ref|| over elements, with got on the GPU (or host) and ref on the host; fails on a non-finite
// got where ref is finite (an unwritten, NaN-poisoned element).
double rel_l2(const Tensor& got, const Tensor& ref) {
  const std::vector<double> g = values(got), r = values(ref);
  REQUIRE(g.size() == r.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    // A Catch2 message and assertion per element cost 0.5-0.75 us each (10M in 7.5 s on a 2-core AMD EPYC): most
    // of the embedding test's 170 s on an H200's host, 155M elements over its tables in four dtypes. So only a
    // failure says which element.
    if (std::isfinite(r[i]) && !std::isfinite(g[i]))
      FAIL("element " << i << ": gpu " << g[i] << ", cpu " << r[i] << " (not finite: left unwritten?)");
    num += (g[i] - r[i]) * (g[i] - r[i]), den += r[i] * r[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The fraction of 16-bit elements within 1 ulp of the reference (bit patterns of the same sign differing by <= 1).
double within_one_ulp(const Tensor& got, const Tensor& ref) {
  const Tensor g = to_host(got);
  int64_t ok = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const int a = bits16(g, i), b = bits16(ref, i);
    ok += (a == b) || (((a ^ b) & 0x8000) == 0 && std::abs(a - b) <= 1) || ((a | b) & 0x7fff) == 0;
  }
  return double(ok) / double(std::max<int64_t>(1, ref.numel()));
}

// The dtype's tolerance on an output stored in that dtype (see the file comment). An fp64 output of fp32 arithmetic
// (the losses of fp32 logits: fp32 sums, then log in double) gets the fp32 bound: `computed_in` names it.
void require_close(const Tensor& got, const Tensor& ref, const std::string& what, DType computed_in = DType::F64) {
  INFO(what << " (" << dtype_name(ref.dtype()) << ")");
  const double rel = rel_l2(got, ref);
  INFO("relative L2 error " << rel);
  switch (ref.dtype() == DType::F64 ? computed_in : ref.dtype()) {
    case DType::F64: REQUIRE(rel <= 1e-12); break;
    case DType::F32: REQUIRE(rel <= 1e-5); break;
    case DType::BF16:
      REQUIRE(rel <= 1e-2);
      REQUIRE(within_one_ulp(got, ref) >= 0.99);
      break;
    case DType::F16:
      REQUIRE(rel <= 5e-3);
      REQUIRE(within_one_ulp(got, ref) >= 0.99);
      break;
    default: FAIL("unexpected dtype");
  }
}

void require_equal(const Tensor& got, const Tensor& ref, const std::string& what) {
  INFO(what << " (" << dtype_name(ref.dtype()) << ")");
  const Tensor g = to_host(got);
  REQUIRE(g.nbytes() == ref.nbytes());
  REQUIRE(std::memcmp(g.data(), ref.data(), ref.nbytes()) == 0);
}

Tensor random_tokens(Shape s, int32_t lo, int32_t hi, uint64_t seed) {
  Tensor t = Tensor::empty(s, DType::I32);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> u(lo, hi - 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<int32_t>()[i] = u(rng);
  return t;
}

}  // namespace

TEST_CASE("cuda layernorm forward, fused residual forward and backward match the CPU", "[cuda][layernorm]") {
  // C=7000: the backward's dweight/dbias partials no longer fit in shared memory (global atomics path);
  // C=37: not a multiple of any 16-byte pack (scalar path).
  for (DType dt : kActivationDtypes) {
    for (auto [N, C] : {std::pair<int64_t, int64_t>{37, 72}, {64, 768}, {7, 37}, {5, 7000}}) {
      INFO(dtype_name(dt) << " N=" << N << " C=" << C);
      const DType acc = acc_dtype(dt);
      const Tensor x = random_host({N, C}, dt, 1, 2.0, 0.3), w = random_host({C}, dt, 2, 0.2, 1.0);
      const Tensor bias = random_host({C}, dt, 3, 0.1);
      Tensor out = Tensor::empty({N, C}, dt), mean = Tensor::empty({N}, acc), rstd = Tensor::empty({N}, acc);
      layernorm_forward(out, mean, rstd, x, w, bias);
      const Tensor dx = upload(x), dw = upload(w), db = upload(bias);
      Tensor gout = poisoned({N, C}, dt), gmean = poisoned({N}, acc), grstd = poisoned({N}, acc);
      layernorm_forward(gout, gmean, grstd, dx, dw, db);
      require_close(gout, out, "out");
      require_close(gmean, mean, "mean");
      require_close(grstd, rstd, "rstd");

      // Fused residual: the CPU composition against the fused kernel, out of place and in place over a.
      const Tensor a = random_host({N, C}, dt, 4, 1.5), b = random_host({N, C}, dt, 5, 0.7, 0.1);
      Tensor res = Tensor::empty({N, C}, dt), ln = Tensor::empty({N, C}, dt);
      residual_layernorm_forward(res, ln, mean, rstd, a, b, w, bias);
      Tensor gres = poisoned({N, C}, dt), gln = poisoned({N, C}, dt);
      residual_layernorm_forward(gres, gln, gmean, grstd, upload(a), upload(b), dw, db);
      require_equal(gres, res, "residual");  // one rounding of the same fp32 sum
      require_close(gln, ln, "ln_out");
      require_close(gmean, mean, "mean (fused)");
      require_close(grstd, rstd, "rstd (fused)");
      Tensor ga = upload(a), gln2 = poisoned({N, C}, dt);
      residual_layernorm_forward(ga, gln2, gmean, grstd, ga, upload(b), dw, db);
      require_equal(ga, res, "residual in place");
      require_close(gln2, ln, "ln_out (in place)");

      // Backward: all three outputs accumulate into random starting values.
      const Tensor dout = random_host({N, C}, dt, 6);
      Tensor dinp = random_host({N, C}, dt, 7), dweight = random_host({C}, acc, 8), dbias = random_host({C}, acc, 9);
      Tensor gdinp = upload(dinp), gdweight = upload(dweight), gdbias = upload(dbias);
      layernorm_forward(out, mean, rstd, x, w, bias);
      layernorm_backward(dinp, dweight, dbias, dout, x, w, mean, rstd);
      layernorm_backward(gdinp, gdweight, gdbias, upload(dout), dx, dw, upload(mean), upload(rstd));
      require_close(gdinp, dinp, "dinp");
      require_close(gdweight, dweight, "dweight (atomics)");
      require_close(gdbias, dbias, "dbias (atomics)");
    }
  }
}

TEST_CASE("cuda gelu forward and backward match the CPU", "[cuda][gelu]") {
  for (DType dt : kActivationDtypes) {
    for (int64_t n : {int64_t(37 * 72), int64_t(1001), int64_t(8 * 64 * 3072)}) {
      INFO(dtype_name(dt) << " n=" << n);
      const Tensor x = random_host({n}, dt, 1, 2.0), dout = random_host({n}, dt, 2);
      Tensor out = Tensor::empty({n}, dt), dinp = Tensor::empty({n}, dt);
      gelu_forward(out, x);
      gelu_backward(dinp, x, dout);
      const Tensor gx = upload(x);
      Tensor gout = poisoned({n}, dt), gdinp = poisoned({n}, dt);
      gelu_forward(gout, gx);
      gelu_backward(gdinp, gx, upload(dout));
      require_close(gout, out, "gelu out");
      require_close(gdinp, dinp, "gelu dinp");
      Tensor gd = upload(dout);  // dinp aliasing dout
      gelu_backward(gd, gx, gd);
      require_close(gd, dinp, "gelu dinp in place");
      // Views one element in: unaligned pointers take the element-by-element path.
      Tensor go = poisoned({n}, dt);
      gelu_forward(go.slice(1, {n - 1}), gx.slice(1, {n - 1}));
      Tensor ref = Tensor::empty({n - 1}, dt);
      gelu_forward(ref, x.slice(1, {n - 1}));
      require_close(go.slice(1, {n - 1}), ref, "gelu out (unaligned)");
    }
  }
}

TEST_CASE("cuda rmsnorm forward and backward match the CPU", "[cuda][rmsnorm]") {
  // C=13000: the backward's dweight partials no longer fit in shared memory (global atomics path);
  // C=37: not a multiple of any 16-byte pack (scalar path).
  const double eps = 1e-6;
  for (DType dt : kActivationDtypes) {
    for (auto [N, C] : {std::pair<int64_t, int64_t>{37, 72}, {64, 768}, {7, 37}, {5, 13000}}) {
      INFO(dtype_name(dt) << " N=" << N << " C=" << C);
      const DType acc = acc_dtype(dt);
      const Tensor x = random_host({N, C}, dt, 1, 2.0, 0.3), w = random_host({C}, dt, 2, 0.2, 1.0);
      Tensor out = Tensor::empty({N, C}, dt), rstd = Tensor::empty({N}, acc);
      rmsnorm_forward(out, rstd, x, w, eps);
      const Tensor gx = upload(x), gw = upload(w);
      Tensor gout = poisoned({N, C}, dt), grstd = poisoned({N}, acc);
      rmsnorm_forward(gout, grstd, gx, gw, eps);
      require_close(gout, out, "out");
      require_close(grstd, rstd, "rstd");

      // Backward: both outputs accumulate into random starting values.
      const Tensor dout = random_host({N, C}, dt, 3);
      Tensor dinp = random_host({N, C}, dt, 4), dweight = random_host({C}, acc, 5);
      Tensor gdinp = upload(dinp), gdweight = upload(dweight);
      rmsnorm_backward(dinp, dweight, dout, x, w, rstd);
      rmsnorm_backward(gdinp, gdweight, upload(dout), gx, gw, upload(rstd));
      require_close(gdinp, dinp, "dinp");
      require_close(gdweight, dweight, "dweight (atomics)");
    }
  }
}

TEST_CASE("cuda rope forward and backward match the CPU, outside the column range untouched", "[cuda][rope]") {
  struct Case {
    int64_t B, T, n_head, head_size, col_begin_heads, col_end_heads, pos_offset;
  };
  // q and k of a fused qkv row (GPT-2-like heads of 64); a middle range of odd-sized heads (6); a continuation at
  // position 1e5 (angles the GPU must form in double as the CPU does).
  const Case cases[] = {{3, 37, 4, 64, 0, 8, 0}, {2, 5, 5, 6, 2, 9, 3}, {2, 64, 12, 64, 0, 24, 100000}};
  for (DType dt : kActivationDtypes) {
    for (const Case& c : cases) {
      const int64_t W = 3 * c.n_head * c.head_size, b = c.col_begin_heads * c.head_size;
      const int64_t e = c.col_end_heads * c.head_size;
      for (bool backward : {false, true}) {
        INFO(dtype_name(dt) << " B=" << c.B << " T=" << c.T << " HS=" << c.head_size << " columns [" << b << ", " << e
                            << ") offset " << c.pos_offset << (backward ? " backward" : " forward"));
        auto apply = backward ? rope_backward : rope_forward;
        Tensor x = random_host({c.B, c.T, W}, dt, 1);
        Tensor gx = upload(x);
        const std::vector<double> before = values(x);
        apply(x, c.T, c.head_size, kRopeTheta, b, e, c.pos_offset);
        apply(gx, c.T, c.head_size, kRopeTheta, b, e, c.pos_offset);
        require_close(gx, x, "rotated");
        const std::vector<double> after = values(gx);
        for (size_t i = 0; i < after.size(); ++i) {
          const int64_t col = int64_t(i) % W;
          if (col < b || col >= e) REQUIRE(after[i] == before[i]);
        }
      }
    }
  }
}

TEST_CASE("cuda swiglu forward and backward match the CPU, in place too", "[cuda][swiglu]") {
  // H=37: N*H not a multiple of any pack (a scalar tail after the packs). Views one element into their buffers
  // (unaligned pointers) take the scalar path: all of them, or only up and dout (one misaligned pointer is enough).
  struct Offsets {
    int64_t gate, up, dout, outputs;
  };
  for (DType dt : kActivationDtypes) {
    for (auto [N, H] : {std::pair<int64_t, int64_t>{37, 72}, {9, 37}, {64, 3072}}) {
      for (const Offsets& o : {Offsets{0, 0, 0, 0}, Offsets{1, 1, 1, 1}, Offsets{0, 1, 1, 0}}) {
        INFO(dtype_name(dt) << " N=" << N << " H=" << H << " offsets gate " << o.gate << " up " << o.up << " dout "
                            << o.dout << " outputs " << o.outputs);
        const int64_t n = N * H;
        const Tensor gateb = random_host({n + o.gate}, dt, 1, 2.0), upb = random_host({n + o.up}, dt, 2, 2.0);
        const Tensor dyb = random_host({n + o.dout}, dt, 3);
        const Tensor gate = gateb.slice(o.gate, {N, H}), up = upb.slice(o.up, {N, H}), dy = dyb.slice(o.dout, {N, H});
        Tensor out = Tensor::empty({N, H}, dt), dgate = Tensor::empty({N, H}, dt), dup = Tensor::empty({N, H}, dt);
        swiglu_forward(out, gate, up);
        swiglu_backward(dgate, dup, dy, gate, up);

        const Tensor ggateb = upload(gateb), gupb = upload(upb), gdyb = upload(dyb);
        const Tensor ggate = ggateb.slice(o.gate, {N, H}), gup = gupb.slice(o.up, {N, H});
        const Tensor gdy = gdyb.slice(o.dout, {N, H});
        Tensor goutb = poisoned({n + o.outputs}, dt), gdgateb = poisoned({n + o.outputs}, dt);
        Tensor gdupb = poisoned({n + o.outputs}, dt);
        const Tensor gout = goutb.slice(o.outputs, {N, H}), gdgate = gdgateb.slice(o.outputs, {N, H});
        const Tensor gdup = gdupb.slice(o.outputs, {N, H});
        swiglu_forward(gout, ggate, gup);
        swiglu_backward(gdgate, gdup, gdy, ggate, gup);
        require_close(gout, out, "swiglu out");
        require_close(gdgate, dgate, "swiglu dgate");
        require_close(gdup, dup, "swiglu dup");

        // In place, as a model's backward pass runs it (dgate replaces gate, dup replaces up), and the swapped
        // aliases: the same bits as the separate outputs.
        for (bool swapped : {false, true}) {
          INFO((swapped ? "dgate is up, dup is gate" : "dgate is gate, dup is up"));
          const Tensor g2b = upload(gateb), u2b = upload(upb);
          const Tensor g2 = g2b.slice(o.gate, {N, H}), u2 = u2b.slice(o.up, {N, H});
          swiglu_backward(swapped ? u2 : g2, swapped ? g2 : u2, gdy, g2, u2);
          require_equal(swapped ? u2 : g2, to_host(gdgate), "swiglu dgate in place");
          require_equal(swapped ? g2 : u2, to_host(gdup), "swiglu dup in place");
        }
        const Tensor d2b = upload(dyb), d2 = d2b.slice(o.dout, {N, H});  // dup replaces dout
        swiglu_backward(gdgate, d2, d2, ggate, gup);
        require_equal(d2, to_host(gdup), "swiglu dup in dout's place");
        const Tensor u3b = upload(upb), u3 = u3b.slice(o.up, {N, H});  // out replaces up
        swiglu_forward(u3, ggate, u3);
        require_equal(u3, to_host(gout), "swiglu out in up's place");
      }
    }
  }
}

TEST_CASE("cuda gqa expansion and reduction match the CPU exactly", "[cuda][gqa]") {
  struct Case {
    int n_head, n_kv_head, head_size;
  };
  // Groups of 4 (Llama-like heads of 64); heads of 5 (scalar path); equal head counts (copies); one kv head.
  const Case cases[] = {{8, 2, 64}, {6, 3, 5}, {4, 4, 16}, {12, 1, 8}};
  for (DType dt : kActivationDtypes) {
    for (const Case& c : cases) {
      // off: q and dq one element into their buffers (one unaligned pointer: the scalar path).
      for (int64_t off : {int64_t(0), int64_t(1)}) {
        INFO(dtype_name(dt) << " n_head " << c.n_head << " n_kv_head " << c.n_kv_head << " head_size "
                            << c.head_size << (off ? " q, dq unaligned" : ""));
        const int64_t N = 37, QW = int64_t(c.n_head) * c.head_size, KW = int64_t(c.n_kv_head) * c.head_size;
        const int64_t WF = 3 * QW;
        const Tensor qb = random_host({N * QW + off}, dt, 1), k = random_host({N, KW}, dt, 2);
        const Tensor v = random_host({N, KW}, dt, 3), dfull = random_host({N, WF}, dt, 4);
        const Tensor q = qb.slice(off, {N, QW});
        Tensor full = Tensor::empty({N, WF}, dt);
        Tensor dq = Tensor::empty({N, QW}, dt), dk = Tensor::empty({N, KW}, dt), dv = Tensor::empty({N, KW}, dt);
        gqa_expand(full, q, k, v, c.n_head, c.n_kv_head, c.head_size);
        gqa_reduce(dq, dk, dv, dfull, c.n_head, c.n_kv_head, c.head_size);

        const Tensor gqb = upload(qb), gq = gqb.slice(off, {N, QW});
        Tensor gfull = poisoned({N, WF}, dt);
        gqa_expand(gfull, gq, upload(k), upload(v), c.n_head, c.n_kv_head, c.head_size);
        Tensor gdqb = poisoned({N * QW + off}, dt), gdk = poisoned({N, KW}, dt), gdv = poisoned({N, KW}, dt);
        const Tensor gdq = gdqb.slice(off, {N, QW});
        gqa_reduce(gdq, gdk, gdv, upload(dfull), c.n_head, c.n_kv_head, c.head_size);
        require_equal(gfull, full, "expanded");  // copies
        require_equal(gdq, dq, "dq");            // copies
        require_equal(gdk, dk, "dk");            // the same sums in the same order, rounded once
        require_equal(gdv, dv, "dv");
      }
    }
  }
}

// Ring attention's block kernels: outputs in the accumulation dtype computed from S inputs. fp32 and fp64 as the
// file's bounds (summation order only); 16-bit S: both devices round each probability to S, but from fp32 values
// that differ in their last bits (the GPU's exp(s - lse), the CPU's exp(s - max) / sum), so a probability near a
// rounding boundary lands one 16-bit ulp apart: the 16-bit bounds on the aggregate.
double block_bound(DType s) {
  return s == DType::F64 ? 1e-12 : s == DType::F32 ? 1e-5 : s == DType::BF16 ? 1e-2 : 5e-3;
}

TEST_CASE("cuda attention_block forward, merge and backward match the CPU", "[cuda][attention_block]") {
  struct Case {
    int64_t B, Tq, Tk;
    int NH, KV, HS;
    BlockMask mask;
  };
  // The diagonal block (Tq == Tk) and a full one; grouped-query heads (4 on 2); head sizes 16, 64 and 40 (not a
  // multiple of 32: idle lanes).
  const Case cases[] = {{2, 37, 37, 4, 2, 16, BlockMask::Causal}, {2, 24, 40, 4, 2, 16, BlockMask::Full},
                        {1, 33, 33, 2, 2, 64, BlockMask::Causal}, {1, 17, 29, 3, 1, 40, BlockMask::Full}};
  for (DType dt : kActivationDtypes) {
    const DType A = acc_dtype(dt);
    const double bound = block_bound(dt);
    for (const Case& c : cases) {
      INFO(dtype_name(dt) << " B " << c.B << " Tq " << c.Tq << " Tk " << c.Tk << " NH " << c.NH << " KV " << c.KV
                          << " HS " << c.HS << (c.mask == BlockMask::Causal ? " causal" : " full"));
      const int64_t C = c.NH * c.HS, KW = c.KV * c.HS;
      const Tensor q = random_host({c.B, c.Tq, C}, dt, 11), k = random_host({c.B, c.Tk, KW}, dt, 12);
      const Tensor v = random_host({c.B, c.Tk, KW}, dt, 13), dout = random_host({c.B, c.Tq, C}, dt, 14);
      Tensor out = Tensor::empty({c.B, c.Tq, C}, A), lse = Tensor::empty({c.B, c.NH, c.Tq}, A);
      attention_block_forward(out, lse, q, k, v, c.NH, c.KV, c.mask);
      Tensor gout = poisoned({c.B, c.Tq, C}, A), glse = poisoned({c.B, c.NH, c.Tq}, A);
      const Tensor gq = upload(q), gk = upload(k), gv = upload(v);
      attention_block_forward(gout, glse, gq, gk, gv, c.NH, c.KV, c.mask);
      CHECK(rel_l2(gout, out) <= bound);
      CHECK(rel_l2(glse, lse) <= (dt == DType::F64 ? 1e-12 : 1e-5));  // fp32 sums of the same widened scores

      // Merge another block's partial result into this one (both devices from the CPU's values).
      const Tensor ob = random_host({c.B, c.Tq, C}, A, 15), lb = random_host({c.B, c.NH, c.Tq}, A, 16, 1.0, 2.0);
      const Tensor mout = clone_host(out), mlse = clone_host(lse);
      attention_block_merge(mout, mlse, ob, lb, c.NH);
      const Tensor gmout = upload(out), gmlse = upload(lse);
      attention_block_merge(gmout, gmlse, upload(ob), upload(lb), c.NH);
      CHECK(rel_l2(gmout, mout) <= (dt == DType::F64 ? 1e-12 : 1e-5));
      CHECK(rel_l2(gmlse, mlse) <= (dt == DType::F64 ? 1e-12 : 1e-5));

      // Backward from the block's own output and lse (out rounded to S, as the ring passes the merged output);
      // the gradients accumulate onto the same small random values on both devices (small, so that the sums the
      // kernels add dominate the comparison).
      Tensor outs = Tensor::empty({c.B, c.Tq, C}, dt);
      copy_convert(outs, out);
      const Tensor dq0 = random_host({c.B, c.Tq, C}, A, 17, 1e-3), dk0 = random_host({c.B, c.Tk, KW}, A, 18, 1e-3);
      const Tensor dv0 = random_host({c.B, c.Tk, KW}, A, 19, 1e-3);
      const Tensor dq = clone_host(dq0), dk = clone_host(dk0), dv = clone_host(dv0);
      attention_block_backward(dq, dk, dv, dout, outs, lse, q, k, v, c.NH, c.KV, c.mask);
      const Tensor gdq = upload(dq0), gdk = upload(dk0), gdv = upload(dv0);
      attention_block_backward(gdq, gdk, gdv, upload(dout), upload(outs), upload(lse), gq, gk, gv, c.NH, c.KV,
                               c.mask);
      CHECK(rel_l2(gdq, dq) <= bound);
      CHECK(rel_l2(gdk, dk) <= bound);
      CHECK(rel_l2(gdv, dv) <= bound);
    }
  }
}

TEST_CASE("cuda add_forward, accumulate and bias_add match the CPU exactly", "[cuda][elementwise]") {
  for (DType dt : kActivationDtypes) {
    for (int64_t n : {int64_t(37 * 72), int64_t(1001), int64_t(1 << 20)}) {
      INFO(dtype_name(dt) << " n=" << n);
      const Tensor a = random_host({n}, dt, 1, 3.0), b = random_host({n}, dt, 2);
      Tensor out = Tensor::empty({n}, dt);
      add_forward(out, a, b);
      Tensor gout = poisoned({n}, dt);
      const Tensor ga = upload(a), gb = upload(b);
      add_forward(gout, ga, gb);
      require_equal(gout, out, "add");
      Tensor galias = upload(a);
      add_forward(galias, galias, gb);
      require_equal(galias, out, "add in place");
      Tensor gu = poisoned({n}, dt);  // unaligned views
      add_forward(gu.slice(1, {n - 1}), ga.slice(1, {n - 1}), gb.slice(1, {n - 1}));
      Tensor ru = Tensor::empty({n - 1}, dt);
      add_forward(ru, a.slice(1, {n - 1}), b.slice(1, {n - 1}));
      require_equal(gu.slice(1, {n - 1}), ru, "add unaligned");

      for (DType st : kActivationDtypes) {  // every (dst, src) pair
        INFO("src " << dtype_name(st));
        const Tensor src = random_host({n}, st, 3);
        Tensor dst = random_host({n}, dt, 4);
        Tensor gdst = upload(dst);
        accumulate(dst, src);
        accumulate(gdst, upload(src));
        require_equal(gdst, dst, "accumulate");
      }
    }
    for (auto [N, OC] : {std::pair<int64_t, int64_t>{37, 72}, {9, 37}, {64, 768}}) {
      INFO(dtype_name(dt) << " N=" << N << " OC=" << OC);
      Tensor out = random_host({N, OC}, dt, 5), bias = random_host({OC}, dt, 6);
      Tensor gout = upload(out);
      bias_add(out, bias);
      bias_add(gout, upload(bias));
      require_equal(gout, out, "bias_add");
    }
  }
}

TEST_CASE("cuda sum_accumulate, sum_squares_accumulate and clip_scale match the CPU", "[cuda][reduce]") {
  // Sums in double on both devices, in different orders: the error is bounded by ~n * 1e-16 * sum|x|, so the
  // fp64 accumulator is compared to 1e-12 of sum|x| and the fp32 one within one fp32 rounding (1e-6 relative).
  for (DType dt : kActivationDtypes) {
    for (int64_t n : {int64_t(37), int64_t(100003), int64_t(3 << 20)}) {
      for (DType acc_dt : {DType::F64, DType::F32}) {
        INFO(dtype_name(dt) << " n=" << n << " acc " << dtype_name(acc_dt));
        const Tensor x = random_host({n}, dt, 1, 1.0, 0.1);
        const std::vector<double> xv = values(x);
        double abs_sum = 0, sq_sum = 0;
        for (double v : xv) abs_sum += std::abs(v), sq_sum += v * v;
        const double tol = acc_dt == DType::F64 ? 1e-12 : 1e-6;
        const Tensor gx = upload(x);
        Tensor acc = random_host({1}, acc_dt, 2), acc2 = random_host({1}, acc_dt, 3);
        Tensor gacc = upload(acc), gacc2 = upload(acc2);
        sum_accumulate(acc, x), sum_accumulate(gacc, gx);
        sum_squares_accumulate(acc2, x), sum_squares_accumulate(gacc2, gx);
        REQUIRE(std::abs(values(gacc)[0] - values(acc)[0]) <= tol * (abs_sum + 1));
        REQUIRE(std::abs(values(gacc2)[0] - values(acc2)[0]) <= tol * (sq_sum + 1));
      }
    }
  }
  // clip_scale: the same double arithmetic on one device thread: exact.
  for (double nsq : {4.0, 0.25, 1e6}) {
    for (double max_norm : {0.0, 1.0, 3.0}) {
      for (double inv : {1.0, 1.0 / 1024}) {
        for (DType sd : {DType::F32, DType::F64}) {
          INFO("norm_sq " << nsq << " max_norm " << max_norm << " inv " << inv << " " << dtype_name(sd));
          Tensor norm_sq = Tensor::empty({1}, DType::F64);
          norm_sq.data_as<double>()[0] = nsq;
          Tensor scale = Tensor::empty({1}, sd), norm = Tensor::empty({1}, DType::F32);
          clip_scale(scale, norm, norm_sq, max_norm, inv);
          Tensor gscale = poisoned({1}, sd), gnorm = poisoned({1}, DType::F32);
          clip_scale(gscale, gnorm, upload(norm_sq), max_norm, inv);
          require_equal(gscale, scale, "scale");
          require_equal(gnorm, norm, "norm");
        }
      }
    }
  }
}

TEST_CASE("cuda embedding forward and backward match the CPU, plain and vocabulary-parallel", "[cuda][embedding]") {
  struct Case {
    int64_t B, T, C, rows, v0, bound, token_range;
    bool with_wpe;
  };
  // Plain (V=101 padded to 128; GPT-2); repeated ids (a range of 5); vocabulary shards with and without wpe.
  const Case cases[] = {{3, 37, 72, 128, 0, -1, 101, true},     {4, 64, 768, 50304, 0, -1, 50257, true},
                        {2, 37, 72, 128, 0, -1, 5, true},       {3, 37, 72, 64, 64, 128, 101, false},
                        {3, 37, 72, 64, 64, 128, 101, true},    {2, 9, 37, 32, 32, 128, 101, true}};
  for (DType dt : kActivationDtypes) {
    for (const Case& c : cases) {
      INFO(dtype_name(dt) << " B=" << c.B << " T=" << c.T << " C=" << c.C << " rows=" << c.rows << " v0=" << c.v0
                          << " wpe " << c.with_wpe);
      const DType acc = acc_dtype(dt);
      const Tensor tokens = random_tokens({c.B, c.T}, 0, int32_t(c.token_range), 1);
      const Tensor wte = random_host({c.rows, c.C}, dt, 2), wpe = random_host({c.T + 3, c.C}, dt, 3);
      const Tensor none;
      Tensor out = Tensor::empty({c.B, c.T, c.C}, dt);
      embedding_forward(out, tokens, wte, c.with_wpe ? wpe : none, c.v0, c.bound);
      const Tensor gtok = upload(tokens), gwpe = upload(wpe);
      Tensor gout = poisoned({c.B, c.T, c.C}, dt);
      embedding_forward(gout, gtok, upload(wte), c.with_wpe ? gwpe : none, c.v0, c.bound);
      require_equal(gout, out, "embedding out");  // copies, or one rounding of the same fp32 sum

      const Tensor dout = random_host({c.B, c.T, c.C}, dt, 4);
      Tensor dwte = random_host({c.rows, c.C}, acc, 5), dwpe = random_host({c.T + 3, c.C}, acc, 6);
      Tensor gdwte = upload(dwte), gdwpe = upload(dwpe);
      embedding_backward(dwte, c.with_wpe ? dwpe : none, dout, tokens, c.v0, c.bound);
      embedding_backward(gdwte, c.with_wpe ? gdwpe : none, upload(dout), gtok, c.v0, c.bound);
      require_close(gdwte, dwte, "dwte (atomics)");
      require_equal(gdwpe, dwpe, "dwpe (same order as the CPU)");
    }
  }
}

TEST_CASE("cuda softmax_xent_forward_backward matches the CPU, in place too", "[cuda][crossentropy]") {
  for (DType dt : kActivationDtypes) {
    for (auto [N, V, Vp] : {std::tuple<int64_t, int64_t, int64_t>{37, 101, 128}, {8, 50257, 50304}, {5, 37, 37}}) {
      const std::vector<DType> loss_dtypes =
          dt == DType::F32 || dt == DType::F64 ? std::vector<DType>{DType::F32, DType::F64}
                                               : std::vector<DType>{DType::F32};
      for (DType ld : loss_dtypes) {
        INFO(dtype_name(dt) << " N=" << N << " V=" << V << " Vp=" << Vp << " losses " << dtype_name(ld));
        const Tensor logits = random_host({N, Vp}, dt, 1, 3.0);
        const Tensor targets = random_tokens({N}, 0, int32_t(V), 2);
        const double dloss = 1.0 / double(N);
        Tensor losses = Tensor::empty({N}, ld), dlogits = Tensor::empty({N, Vp}, dt);
        softmax_xent_forward_backward(losses, dlogits, logits, targets, V, dloss);
        const Tensor gl = upload(logits), gt = upload(targets);
        Tensor glosses = poisoned({N}, ld), gd = poisoned({N, Vp}, dt);
        softmax_xent_forward_backward(glosses, gd, gl, gt, V, dloss);
        require_close(glosses, losses, "losses", acc_dtype(dt));
        require_close(gd, dlogits, "dlogits");
        Tensor ginplace = upload(logits), glosses2 = poisoned({N}, ld);  // the gradient over the logits
        softmax_xent_forward_backward(glosses2, ginplace, ginplace, gt, V, dloss);
        require_close(glosses2, losses, "losses (in place)", acc_dtype(dt));
        require_close(ginplace, dlogits, "dlogits (in place)");
        Tensor glosses3 = poisoned({N}, ld);  // losses only
        softmax_xent_forward_backward(glosses3, Tensor(), gl, gt, V, dloss);
        require_close(glosses3, losses, "losses (no gradient)", acc_dtype(dt));
      }
    }
  }
}

TEST_CASE("cuda vocab-parallel cross-entropy steps match the CPU on every shard", "[cuda][vocab_parallel]") {
  // Each shard's three steps run on both devices from the same inputs (no all-reduce: the global row_max and
  // stats fed to the later steps are the CPU's, so each step is compared on its own). V=37 over 4 shards of 32
  // leaves shards with no real column (nreal = 0).
  for (DType dt : kActivationDtypes) {
    for (auto [N, V, Vp, shards] :
         {std::tuple<int64_t, int64_t, int64_t, int64_t>{37, 101, 128, 2}, {37, 37, 128, 4}, {4, 50257, 50304, 2}}) {
      const DType acc = acc_dtype(dt);
      const int64_t Vl = Vp / shards;
      const Tensor targets = random_tokens({N}, 0, int32_t(V), 2), gt = upload(targets);
      for (int64_t s = 0; s < shards; ++s) {
        const int64_t v0 = s * Vl;
        INFO(dtype_name(dt) << " N=" << N << " V=" << V << " shard " << s << " of " << shards);
        const Tensor logits = random_host({N, Vl}, dt, 10 + s, 3.0), gl = upload(logits);
        Tensor row_max = Tensor::empty({N}, acc), grow_max = poisoned({N}, acc);
        vocab_parallel_xent_local_max(row_max, logits, v0, V);
        vocab_parallel_xent_local_max(grow_max, gl, v0, V);
        require_equal(grow_max, row_max, "row_max");  // a max is exact
        // A global max: this shard's, raised a little, as another shard's larger logits would.
        Tensor global_max = Tensor::empty({N}, acc);
        {
          const std::vector<double> m = values(row_max);
          Tensor d = Tensor::empty({N}, DType::F64);
          for (int64_t n = 0; n < N; ++n) d.data_as<double>()[n] = std::isfinite(m[n]) ? m[n] + 0.5 : 4.0;
          copy_convert(global_max, d);
        }
        const Tensor gmax = upload(global_max);
        Tensor stats = Tensor::empty({2, N}, acc), gstats = poisoned({2, N}, acc);
        vocab_parallel_xent_local_sums(stats, logits, targets, global_max, v0, V);
        vocab_parallel_xent_local_sums(gstats, gl, gt, gmax, v0, V);
        require_close(gstats, stats, "stats");
        // The finishing step on reduced-looking stats: the sums made positive (a shard with no real column has 0).
        Tensor global_stats = clone_host(stats);
        {
          const std::vector<double> st = values(stats);
          Tensor d = Tensor::empty({2, N}, DType::F64);
          for (int64_t i = 0; i < 2 * N; ++i) d.data_as<double>()[i] = i < N ? st[i] + 1.0 : st[i];
          copy_convert(global_stats, d);
        }
        const Tensor gstats_in = upload(global_stats);
        const double dloss = 1.0 / double(N);
        Tensor losses = Tensor::empty({N}, DType::F32), dlogits = Tensor::empty({N, Vl}, dt);
        vocab_parallel_xent_finish(losses, dlogits, logits, targets, global_max, global_stats, v0, V, dloss);
        Tensor glosses = poisoned({N}, DType::F32), gd = poisoned({N, Vl}, dt);
        vocab_parallel_xent_finish(glosses, gd, gl, gt, gmax, gstats_in, v0, V, dloss);
        require_close(glosses, losses, "losses", acc_dtype(dt));
        require_close(gd, dlogits, "dlogits");
        Tensor ginplace = upload(logits);
        vocab_parallel_xent_finish(glosses, ginplace, ginplace, gt, gmax, gstats_in, v0, V, dloss);
        require_close(ginplace, dlogits, "dlogits (in place)");
        Tensor glosses2 = poisoned({N}, DType::F32);
        vocab_parallel_xent_finish(glosses2, Tensor(), gl, gt, gmax, gstats_in, v0, V, dloss);
        require_close(glosses2, losses, "losses (no gradient)");
      }
    }
  }
}

namespace {
// 3 optimizer steps of `step` on host and device copies of fp32 (or fp64) state; compares every buffer.
template <typename Step>
void compare_optimizer(int64_t n, DType param_dt, DType grad_dt, DType scale_dt, int buffers, Step step) {
  std::vector<Tensor> host, dev;
  host.push_back(random_host({n}, param_dt, 1));  // params
  // m (or the momentum buffer) small and signed; AdamW's v positive (1e-3 +- 1e-4: 10 sigma from zero).
  for (int b = 1; b < buffers; ++b) host.push_back(b == 2 ? random_host({n}, param_dt, 1 + b, 1e-4, 1e-3)
                                                          : random_host({n}, param_dt, 1 + b, 0.01));
  Tensor scale = Tensor::empty({1}, scale_dt);
  {
    Tensor d = Tensor::empty({1}, DType::F64);
    d.data_as<double>()[0] = 0.75;
    copy_convert(scale, d);
  }
  for (const Tensor& t : host) dev.push_back(upload(t));
  const Tensor gscale = upload(scale);
  for (int s = 1; s <= 3; ++s) {
    // Uploaded before the host step: outer_nesterov_update overwrites its x (the "gradient") in place.
    const Tensor grads = random_host({n}, grad_dt, 100 + s), dev_grads = upload(grads);
    step(host, grads, scale, s);
    step(dev, dev_grads, gscale, s);
  }
  for (int b = 0; b < buffers; ++b) {
    INFO("buffer " << b);
    const double rel = rel_l2(dev[b], host[b]);
    INFO("relative L2 error " << rel);
    REQUIRE(rel <= (param_dt == DType::F64 ? 1e-12 : 1e-6));
  }
}
}  // namespace

TEST_CASE("cuda outer_nesterov_update (local SGD's outer step) matches the CPU over 3 steps", "[cuda][sgd]") {
  // Buffers: the anchor, the velocity; each step's x (the averaged weights) is the step's random "gradient".
  for (DType dt : {DType::F32, DType::F64})
    for (int64_t n : {int64_t(1001), int64_t(1 << 20) + 3}) {
      INFO(dtype_name(dt) << " n=" << n);
      compare_optimizer(n, dt, dt, DType::F32, 2, [](std::vector<Tensor>& s, const Tensor& x, const Tensor&, int) {
        outer_nesterov_update(s[0], s[1], x, 0.7, 0.9);
      });
    }
}

TEST_CASE("cuda adamw_update and sgd_update match the CPU over 3 steps", "[cuda][adamw][sgd]") {
  struct Types {
    DType params, grads, scale;
  };
  for (Types t : {Types{DType::F32, DType::F32, DType::F32}, Types{DType::F32, DType::F64, DType::F64},
                  Types{DType::F64, DType::F64, DType::F32}}) {
    for (int64_t n : {int64_t(1001), int64_t(1 << 20) + 3}) {
      INFO("params " << dtype_name(t.params) << " grads " << dtype_name(t.grads) << " n=" << n);
      compare_optimizer(n, t.params, t.grads, t.scale, 3,
                        [](std::vector<Tensor>& s, const Tensor& g, const Tensor& scale, int step) {
                          AdamWHyper h;
                          h.lr = 1e-3, h.weight_decay = 0.1, h.step = step;
                          adamw_update(s[0], g, s[1], s[2], scale, h);
                        });
      compare_optimizer(n, t.params, t.grads, t.scale, 2,
                        [](std::vector<Tensor>& s, const Tensor& g, const Tensor& scale, int) {
                          SGDHyper h;
                          h.lr = 1e-2, h.momentum = 0.9, h.weight_decay = 0.1;
                          sgd_update(s[0], g, s[1], scale, h);
                        });
    }
  }
}
