// Ring attention for context parallelism: the block kernel (kernels/attention_block.h) against finite differences
// and against the causal attention kernel, the zigzag layout and the ring schedule, and the ring op
// (model/ring_attention.h) on cp = world size ranks against single-rank attention on the whole sequence and
// against finite differences; and a whole model's passes under context parallelism against one rank's. The [ring]
// cases are collective: ctest runs them on 1 rank (every case), 2 ranks
// (the [ring] cases) and 4 ranks (the [parity] cases only): tests/ring_attention_tests.cmake.
#include <catch2/catch.hpp>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "comm/make_communicator.h"
#include "core/arena.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/attention_block.h"
#include "kernels/gqa.h"
#include "model/gpt.h"
#include "model/ring_attention.h"
#include "test_support.h"

using namespace mt;
using namespace mt::kernels;

namespace {

Tensor f64(Shape s) { return Tensor::empty(s, DType::F64); }

void fill_normal(const Tensor& t, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  double* p = t.data_as<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = scale * nd(rng);
}

Tensor convert(const Tensor& t, DType d) {
  Tensor r = Tensor::empty(t.shape(), d);
  copy_convert(r, t);
  return r;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.data_as<double>()[i] * b.data_as<double>()[i];
  return s;
}

// Largest |a - b| / (atol + rtol * |b|) over the elements (compared in fp64): <= 1 means they agree.
double max_err(const Tensor& a, const Tensor& b, double rtol, double atol) {
  REQUIRE(a.numel() == b.numel());
  const Tensor x = convert(a, DType::F64), y = convert(b, DType::F64);
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double u = x.data_as<double>()[i], w = y.data_as<double>()[i];
    worst = std::max(worst, std::abs(u - w) / (atol + rtol * std::abs(w)));
  }
  return worst;
}

// Central differences against the analytic gradient g of loss() w.r.t. x (fp64). With h = 1e-6 * max(1, |x|) and
// O(1) inputs and losses (|L| < 50 here), the truncation error O(h^2 |L'''|) is ~1e-12 and the rounding error
// O(eps |L| / h) ~ 1e-8 at worst, so |numeric - analytic| <= 1e-7 * max(1, |analytic|) holds with a margin, while an
// indexing or formula error gives errors of order 1e-3 .. 1.
void fd_check(const std::string& name, const std::function<double()>& loss, const Tensor& x, const Tensor& g) {
  double* p = x.data_as<double>();
  const double* a = g.data_as<double>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double x0 = p[i], h = 1e-6 * std::max(1.0, std::abs(x0));
    p[i] = x0 + h;
    const double lp = loss();
    p[i] = x0 - h;
    const double lm = loss();
    p[i] = x0;
    const double num = (lp - lm) / (2 * h);
    INFO(name << "[" << i << "]: analytic " << a[i] << ", numeric " << num);
    REQUIRE(std::abs(num - a[i]) <= 1e-7 * std::max(1.0, std::abs(a[i])));
  }
}

// Rows [t0, t0 + n) of every batch element of x [B, T, W], as a new [B, n, W] tensor.
Tensor rows(const Tensor& x, int64_t t0, int64_t n) {
  const int64_t B = x.dim(0), T = x.dim(1), W = x.dim(2);
  Tensor r = Tensor::empty(Shape{B, n, W}, x.dtype());
  for (int64_t b = 0; b < B; ++b)
    copy_convert(r.slice(b * n * W, Shape{n * W}), x.slice((b * T + t0) * W, Shape{n * W}));
  return r;
}

// Causal attention of the whole sequence on one rank: q [B, T, NH*HS], k, v [B, T, KV*HS] expanded to the packed
// qkv of kernels/attention.h (gqa_expand), attention_forward and _backward, and the gradient reduced back
// (gqa_reduce). All in q's dtype.
struct Reference {
  Tensor out, dq, dk, dv;
};
Reference reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, int NH, int KV) {
  const int64_t B = q.dim(0), T = q.dim(1), C = q.dim(2);
  const DType dt = q.dtype();
  Tensor qkv = Tensor::empty(Shape{B, T, 3 * C}, dt), dqkv = Tensor::empty(Shape{B, T, 3 * C}, dt);
  Tensor att = Tensor::empty(Shape{B, NH, T, T}, dt), datt = Tensor::empty(Shape{B, NH, T, T}, acc_dtype(dt));
  gqa_expand(qkv, q, k, v, NH, KV, int(C / NH));
  Reference r{Tensor::empty(q.shape(), dt), Tensor::empty(q.shape(), dt), Tensor::empty(k.shape(), dt),
              Tensor::empty(v.shape(), dt)};
  attention_forward(r.out, att, qkv, NH);
  attention_backward(dqkv, datt, dout, qkv, r.out, att, NH);
  gqa_reduce(r.dq, r.dk, r.dv, dqkv, NH, KV, int(C / NH));
  return r;
}

std::unique_ptr<Communicator> world(CommOptions::Transport t = CommOptions::Transport::Auto) {
  CommOptions o;
  o.timeout_s = 60;  // a mismatched rank aborts the job instead of hanging CI
  o.transport = t;
  return make_communicator(MPI_COMM_WORLD, "cp", o);
}

double all_reduce_sum(double x) {
  double y = 0;
  MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return y;
}

}  // namespace

TEST_CASE("attention_block: finite-difference gradients of the causal and the full block (fp64)", "[attention_block]") {
  // NH = 4 query heads over KV = 2 kv heads (grouped-query attention), HS = 3.
  const int NH = 4, KV = 2;
  const int64_t B = 2, Tq = 3, HS = 3, C = NH * HS, KW = KV * HS;
  for (BlockMask mask : {BlockMask::Causal, BlockMask::Full}) {
    const int64_t Tk = mask == BlockMask::Causal ? Tq : 4;
    INFO((mask == BlockMask::Causal ? "causal" : "full") << " block, Tq = " << Tq << ", Tk = " << Tk);
    Tensor q = f64({B, Tq, C}), k = f64({B, Tk, KW}), v = f64({B, Tk, KW}), w = f64({B, Tq, C});
    fill_normal(q, 1), fill_normal(k, 2), fill_normal(v, 3), fill_normal(w, 4);
    Tensor out = f64({B, Tq, C}), lse = f64({B, NH, Tq});
    auto loss = [&] {
      attention_block_forward(out, lse, q, k, v, NH, KV, mask);
      return dot(out, w);
    };
    loss();
    // A naive reference of one row's log-sum-exp: (b, h, i) = (1, 3, 1), kv head 1.
    {
      const int64_t b = 1, h = 3, i = 1, g = 1, n = mask == BlockMask::Causal ? i + 1 : Tk;
      double z = 0;
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t c = 0; c < HS; ++c)
          s += q.data_as<double>()[(b * Tq + i) * C + h * HS + c] * k.data_as<double>()[(b * Tk + j) * KW + g * HS + c];
        z += std::exp(s / std::sqrt(double(HS)));
      }
      REQUIRE(std::abs(lse.data_as<double>()[(b * NH + h) * Tq + i] - std::log(z)) < 1e-14);
    }
    Tensor dq = f64({B, Tq, C}), dk = f64({B, Tk, KW}), dv = f64({B, Tk, KW});
    zero_(dq), zero_(dk), zero_(dv);
    attention_block_backward(dq, dk, dv, w, out, lse, q, k, v, NH, KV, mask);
    fd_check("q", loss, q, dq);
    fd_check("k", loss, k, dk);
    fd_check("v", loss, v, dv);
    // The backward pass accumulates: a second call doubles every gradient. Not bit for bit: the GEMMs add their
    // products into the existing values (C += A B), which rounds differently from 2 x; so within 1e-14.
    // fd_check's last forward pass ran at a perturbed input: run it again at the unperturbed one first.
    loss();
    Tensor dq2 = convert(dq, DType::F64), dk2 = convert(dk, DType::F64), dv2 = convert(dv, DType::F64);
    attention_block_backward(dq2, dk2, dv2, w, out, lse, q, k, v, NH, KV, mask);
    for (auto [once, twice] : {std::pair{&dq, &dq2}, std::pair{&dk, &dk2}, std::pair{&dv, &dv2}}) {
      Tensor doubled = convert(*once, DType::F64);
      for (int64_t i = 0; i < doubled.numel(); ++i) doubled.data_as<double>()[i] *= 2;
      REQUIRE(max_err(*twice, doubled, 1e-14, 1e-14) <= 1);
    }
  }
}

TEST_CASE("attention_block: diagonal and full blocks merged equal causal attention on the two chunks",
          "[attention_block]") {
  // The sequence [chunk 0 | chunk 1] of 2 Tc tokens: chunk 0's queries see (0, 0) causal; chunk 1's see (1, 1)
  // causal merged with (1, 0) full. fp64: the same sums in other orders, so 1e-13 (values are O(1)).
  const int NH = 4, KV = 2;
  const int64_t B = 2, Tc = 4, T = 2 * Tc, HS = 3, C = NH * HS, KW = KV * HS;
  Tensor q = f64({B, T, C}), k = f64({B, T, KW}), v = f64({B, T, KW}), g = f64({B, T, C});
  fill_normal(q, 11), fill_normal(k, 12), fill_normal(v, 13), fill_normal(g, 14);
  const Reference ref = reference(q, k, v, g, NH, KV);

  Tensor qc[2] = {rows(q, 0, Tc), rows(q, Tc, Tc)}, kc[2] = {rows(k, 0, Tc), rows(k, Tc, Tc)},
         vc[2] = {rows(v, 0, Tc), rows(v, Tc, Tc)}, gc[2] = {rows(g, 0, Tc), rows(g, Tc, Tc)};
  Tensor out[2] = {f64({B, Tc, C}), f64({B, Tc, C})}, lse[2] = {f64({B, NH, Tc}), f64({B, NH, Tc})};
  Tensor po = f64({B, Tc, C}), pl = f64({B, NH, Tc});
  attention_block_forward(out[0], lse[0], qc[0], kc[0], vc[0], NH, KV, BlockMask::Causal);
  attention_block_forward(out[1], lse[1], qc[1], kc[1], vc[1], NH, KV, BlockMask::Causal);
  attention_block_forward(po, pl, qc[1], kc[0], vc[0], NH, KV, BlockMask::Full);
  attention_block_merge(out[1], lse[1], po, pl, NH);
  CHECK(max_err(out[0], rows(ref.out, 0, Tc), 1e-13, 1e-13) <= 1);
  CHECK(max_err(out[1], rows(ref.out, Tc, Tc), 1e-13, 1e-13) <= 1);

  // Merging in the other order, from an empty (0, -inf) accumulator, gives the same result.
  {
    Tensor o = f64({B, Tc, C}), l = f64({B, NH, Tc}), o2 = f64({B, Tc, C}), l2 = f64({B, NH, Tc});
    zero_(o);
    for (int64_t i = 0; i < l.numel(); ++i) l.data_as<double>()[i] = -INFINITY;
    attention_block_forward(o2, l2, qc[1], kc[0], vc[0], NH, KV, BlockMask::Full);
    attention_block_merge(o, l, o2, l2, NH);
    attention_block_forward(o2, l2, qc[1], kc[1], vc[1], NH, KV, BlockMask::Causal);
    attention_block_merge(o, l, o2, l2, NH);
    CHECK(max_err(o, out[1], 1e-14, 1e-14) <= 1);
    CHECK(max_err(l, lse[1], 1e-14, 1e-14) <= 1);
  }

  // Backward: the three blocks' shares, from the merged out and lse, sum to the whole gradient.
  Tensor dq[2] = {f64({B, Tc, C}), f64({B, Tc, C})}, dk[2] = {f64({B, Tc, KW}), f64({B, Tc, KW})},
         dv[2] = {f64({B, Tc, KW}), f64({B, Tc, KW})};
  for (int c = 0; c < 2; ++c) zero_(dq[c]), zero_(dk[c]), zero_(dv[c]);
  attention_block_backward(dq[0], dk[0], dv[0], gc[0], out[0], lse[0], qc[0], kc[0], vc[0], NH, KV, BlockMask::Causal);
  attention_block_backward(dq[1], dk[1], dv[1], gc[1], out[1], lse[1], qc[1], kc[1], vc[1], NH, KV, BlockMask::Causal);
  attention_block_backward(dq[1], dk[0], dv[0], gc[1], out[1], lse[1], qc[1], kc[0], vc[0], NH, KV, BlockMask::Full);
  for (int c = 0; c < 2; ++c) {
    INFO("chunk " << c);
    CHECK(max_err(dq[c], rows(ref.dq, c * Tc, Tc), 1e-12, 1e-12) <= 1);
    CHECK(max_err(dk[c], rows(ref.dk, c * Tc, Tc), 1e-12, 1e-12) <= 1);
    CHECK(max_err(dv[c], rows(ref.dv, c * Tc, Tc), 1e-12, 1e-12) <= 1);
  }
}

TEST_CASE("attention_block: bf16 storage runs the same template within bf16's rounding", "[attention_block]") {
  // bf16 inputs (the fp64 reference sees the same rounded values); the probabilities are rounded to bf16 before
  // P V, as the attention kernel rounds its stored probabilities: relative 2^-8 per probability, so outputs of
  // O(1) agree within 2e-2. The block output and lse are fp32.
  const int NH = 2, KV = 1;
  const int64_t B = 1, T = 6, HS = 4, C = NH * HS, KW = KV * HS;
  Tensor q = f64({B, T, C}), k = f64({B, T, KW}), v = f64({B, T, KW}), g = f64({B, T, C});
  fill_normal(q, 21), fill_normal(k, 22), fill_normal(v, 23), fill_normal(g, 24);
  Tensor qb = convert(q, DType::BF16), kb = convert(k, DType::BF16), vb = convert(v, DType::BF16);
  const Reference ref = reference(convert(qb, DType::F64), convert(kb, DType::F64), convert(vb, DType::F64), g, NH, KV);
  Tensor out = Tensor::empty(Shape{B, T, C}, DType::F32), lse = Tensor::empty(Shape{B, NH, T}, DType::F32);
  attention_block_forward(out, lse, qb, kb, vb, NH, KV, BlockMask::Causal);
  CHECK(max_err(out, ref.out, 2e-2, 2e-2) <= 1);
  Tensor dq = Tensor::empty(Shape{B, T, C}, DType::F32), dk = Tensor::empty(Shape{B, T, KW}, DType::F32),
         dv = Tensor::empty(Shape{B, T, KW}, DType::F32);
  attention_block_backward(dq, dk, dv, convert(g, DType::BF16), convert(out, DType::BF16), lse, qb, kb, vb, NH, KV,
                           BlockMask::Causal);
  // Gradients: sums of T products of rounded values; O(1) values, 5e-2.
  CHECK(max_err(dq, ref.dq, 5e-2, 5e-2) <= 1);
  CHECK(max_err(dk, ref.dk, 5e-2, 5e-2) <= 1);
  CHECK(max_err(dv, ref.dv, 5e-2, 5e-2) <= 1);
}

#ifndef MESHTRAIN_WITH_CUDA
// The GPU kernels are tested against these in tests/test_cuda_attention_block.cpp.
TEST_CASE("attention_block: cuda tensors in a build without CUDA fail with a clear message", "[attention_block]") {
  double dummy[64] = {};
  const Tensor c{dummy, Shape{1, 2, 4}, DType::F64, Device::CUDA}, l{dummy, Shape{1, 2, 2}, DType::F64, Device::CUDA};
  const std::string msg = mt::test::abort_message("ring_attention", [&] {
    attention_block_forward(c, l, c, c, c, 2, 2, BlockMask::Causal);
  });
  CHECK(msg.find("attention_block_forward: tensor is on cuda, but meshtrain was built without the CUDA backend") !=
        std::string::npos);
}
#endif

TEST_CASE("zigzag layout: positions, shard and unshard, and the ring schedule", "[zigzag]") {
  // cp = 2, T = 8 (Tc = 2): rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  CHECK(zigzag_positions(8, 2, 0) == std::vector<int64_t>{0, 1, 6, 7});
  CHECK(zigzag_positions(8, 2, 1) == std::vector<int64_t>{2, 3, 4, 5});
  CHECK(zigzag_positions(4, 1, 0) == std::vector<int64_t>{0, 1, 2, 3});
  for (int cp : {1, 2, 3, 4}) {
    const int64_t T = 2 * cp * 3;
    // Every position on exactly one rank; shard then unshard rebuilds any tensor (int32 tokens, fp32 rows).
    std::set<int64_t> seen;
    Tensor tok = Tensor::empty(Shape{2, T}, DType::I32), back = Tensor::empty(Shape{2, T}, DType::I32);
    Tensor x = Tensor::empty(Shape{2, T, 3}, DType::F32), xb = Tensor::empty(Shape{2, T, 3}, DType::F32);
    for (int64_t i = 0; i < tok.numel(); ++i) tok.data_as<int32_t>()[i] = int32_t(i);
    for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = float(i) + 0.5f;
    for (int r = 0; r < cp; ++r) {
      const std::vector<int64_t> pos = zigzag_positions(T, cp, r);
      seen.insert(pos.begin(), pos.end());
      Tensor lt = Tensor::empty(Shape{2, T / cp}, DType::I32), lx = Tensor::empty(Shape{2, T / cp, 3}, DType::F32);
      zigzag_shard(lt, tok, cp, r), zigzag_shard(lx, x, cp, r);
      for (int64_t b = 0; b < 2; ++b)
        for (size_t t = 0; t < pos.size(); ++t) {
          REQUIRE(lt.data_as<int32_t>()[b * (T / cp) + int64_t(t)] == tok.data_as<int32_t>()[b * T + pos[t]]);
          REQUIRE(lx.data_as<float>()[(b * (T / cp) + int64_t(t)) * 3 + 2] ==
                  x.data_as<float>()[(b * T + pos[t]) * 3 + 2]);
        }
      zigzag_unshard(back, lt, cp, r), zigzag_unshard(xb, lx, cp, r);
    }
    CHECK(int64_t(seen.size()) == T);
    for (int64_t i = 0; i < tok.numel(); ++i) REQUIRE(back.data_as<int32_t>()[i] == tok.data_as<int32_t>()[i]);
    for (int64_t i = 0; i < x.numel(); ++i) REQUIRE(xb.data_as<float>()[i] == x.data_as<float>()[i]);

    // The schedule: over its cp steps each rank computes every causal (query chunk, key chunk) pair of its two
    // query chunks exactly once (global chunk j < i: full, j == i: causal), nothing above the diagonal, and the
    // same number of blocks as every other rank at every step (2 full blocks after the first).
    for (int r = 0; r < cp; ++r) {
      std::set<std::pair<int, int>> pairs;
      for (int s = 0; s < cp; ++s) {
        const RingStep st = ring_attention_step(cp, r, s);
        CHECK(st.source == (r - s + cp) % cp);
        CHECK(st.count == (s == 0 ? 3 : 2));
        const ZigzagChunks mine = zigzag_chunks(cp, r), theirs = zigzag_chunks(cp, st.source);
        for (const RingBlock& b : st) {
          const int i = b.q_chunk == 0 ? mine.first : mine.second, j = b.kv_chunk == 0 ? theirs.first : theirs.second;
          REQUIRE(j <= i);
          CHECK((b.mask == BlockMask::Causal) == (i == j));
          CHECK(pairs.insert({i, j}).second);
        }
      }
      const ZigzagChunks mine = zigzag_chunks(cp, r);
      CHECK(int(pairs.size()) == (mine.first + 1) + (mine.second + 1));  // all j <= i for both query chunks
    }
  }
}

namespace {

// Ring attention on the world communicator (cp = world size) against reference() on the whole sequence, which
// every rank computes; each rank compares its own zigzag rows. B = 2, Tc = 3, NH = 4 over KV = 2, HS = 4.
void ring_parity(Communicator& cp, DType dt, double tol, Arena* arena) {
  const int P = cp.size(), r = cp.rank(), NH = 4, KV = 2;
  const int64_t B = 2, Tc = 3, T = 2 * P * Tc, TL = 2 * Tc, HS = 4, C = NH * HS, KW = KV * HS;
  Tensor q = f64({B, T, C}), k = f64({B, T, KW}), v = f64({B, T, KW}), g = f64({B, T, C});
  fill_normal(q, 31), fill_normal(k, 32), fill_normal(v, 33), fill_normal(g, 34);  // the same on every rank
  q = convert(q, dt), k = convert(k, dt), v = convert(v, dt), g = convert(g, dt);
  const Reference ref = reference(q, k, v, g, NH, KV);

  auto local = [&](const Tensor& full) {
    Tensor t = Tensor::empty(Shape{B, TL, full.dim(2)}, dt);
    zigzag_shard(t, full, P, r);
    return t;
  };
  const Tensor ql = local(q), kl = local(k), vl = local(v), gl = local(g);
  Tensor out = Tensor::empty(ql.shape(), dt), lse = Tensor::empty(ring_attention_lse_shape(B, NH, TL), acc_dtype(dt));
  Tensor dq = Tensor::empty(ql.shape(), dt), dk = Tensor::empty(kl.shape(), dt), dv = Tensor::empty(vl.shape(), dt);
  // Two rounds (a second layer's tags): with an arena, the second round's temporaries hold the first round's
  // values, so anything the op forgot to initialise would show.
  for (int round = 0; round < 2; ++round) {
    INFO("round " << round);
    if (arena) arena->reset();
    const int tag_base = 100 + round * kRingAttentionTags;
    ring_attention_forward(cp, out, lse, ql, kl, vl, NH, KV, tag_base, arena);
    ring_attention_backward(cp, dq, dk, dv, gl, ql, kl, vl, out, lse, NH, KV, tag_base, arena);
    CHECK(max_err(out, local(ref.out), tol, tol) <= 1);
    CHECK(max_err(dq, local(ref.dq), tol, tol) <= 1);
    CHECK(max_err(dk, local(ref.dk), tol, tol) <= 1);
    CHECK(max_err(dv, local(ref.dv), tol, tol) <= 1);
  }
}

}  // namespace

TEST_CASE("ring attention: output and gradients equal single-rank causal attention", "[ring][parity]") {
  const int P = [] {
    int n = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
  }();
  INFO("cp = " << P);
  // fp64: the same sums in other orders (blocks merged through the log-sum-exp, dk and dv summed around the ring):
  // agreement to ~1e-15 relative, checked at 1e-12. fp32: the same at fp32's 6e-8 per operation, checked at 1e-5.
  SECTION("fp64, shared-memory and MPI transports") {
    for (auto t : {CommOptions::Transport::Shm, CommOptions::Transport::Mpi}) {
      auto cp = world(t);
      ring_parity(*cp, DType::F64, 1e-12, nullptr);
    }
  }
  SECTION("fp32, temporaries from an arena") {
    auto cp = world();
    Arena arena;
    ring_parity(*cp, DType::F32, 1e-5, &arena);
  }
}

TEST_CASE("ring attention: finite-difference gradient of the whole op (fp64)", "[ring][fd]") {
  // loss = sum over ranks of <w, out> (all-reduced); every rank perturbs the same element of the full q, k or v
  // and re-shards, so a perturbation lands on whichever rank owns it. B = 1, Tc = 2, NH = 2 over KV = 1, HS = 2.
  auto cp = world();
  const int P = cp->size(), r = cp->rank(), NH = 2, KV = 1;
  const int64_t B = 1, Tc = 2, T = 2 * P * Tc, TL = 2 * Tc, HS = 2, C = NH * HS, KW = KV * HS;
  Tensor q = f64({B, T, C}), k = f64({B, T, KW}), v = f64({B, T, KW}), w = f64({B, T, C});
  fill_normal(q, 41), fill_normal(k, 42), fill_normal(v, 43), fill_normal(w, 44);
  Tensor ql = f64({B, TL, C}), kl = f64({B, TL, KW}), vl = f64({B, TL, KW}), wl = f64({B, TL, C});
  Tensor out = f64({B, TL, C}), lse = f64(ring_attention_lse_shape(B, NH, TL));
  zigzag_shard(wl, w, P, r);
  auto loss = [&] {
    zigzag_shard(ql, q, P, r), zigzag_shard(kl, k, P, r), zigzag_shard(vl, v, P, r);
    ring_attention_forward(*cp, out, lse, ql, kl, vl, NH, KV, 7);
    return all_reduce_sum(dot(out, wl));
  };
  loss();
  Tensor dql = f64({B, TL, C}), dkl = f64({B, TL, KW}), dvl = f64({B, TL, KW});
  ring_attention_backward(*cp, dql, dkl, dvl, wl, ql, kl, vl, out, lse, NH, KV, 7);
  // The full gradients: each rank's rows, zeros elsewhere, summed over ranks.
  auto gather = [&](const Tensor& local, const Tensor& like) {
    Tensor full = f64(like.shape());
    zero_(full);
    zigzag_unshard(full, local, P, r);
    MPI_Allreduce(MPI_IN_PLACE, full.data(), int(full.numel()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return full;
  };
  const Tensor dq = gather(dql, q), dk = gather(dkl, k), dv = gather(dvl, v);
  fd_check("q", loss, q, dq);
  fd_check("k", loss, k, dk);
  fd_check("v", loss, v, dv);
}

// The model's passes under context parallelism (GPT::set_cp_comm, model/context_parallel.h): each rank runs its zigzag
// chunks of every sequence; the loss sums and the parameter gradients, summed over cp, equal one rank's on the whole
// sequences (fp64: the same sums in other orders, checked at 1e-11 of the largest gradient). GPT-2 (learned
// positions gathered and scattered) and Llama with grouped-query attention (rotary angles at global positions), with
// no recomputation, selective (the ring again in the backward) and full (the block's forward again).
TEST_CASE("a model under context parallelism gives one rank's loss and gradients", "[ring][parity][model]") {
  auto cp = world();
  const int P = cp->size(), r = cp->rank();
  const int B = 2, T = 4 * P;  // two tokens per chunk
  for (const ModelArch arch : {ModelArch::GPT2, ModelArch::Llama})
  for (const Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    INFO(name_of(arch) << ", recompute " << name_of(rc) << ", cp = " << P);
    GPTConfig g;
    g.arch = arch;
    g.recompute = rc;
    g.n_layer = 2;
    g.n_head = 4;
    g.d_model = 16;
    g.seq_len = T;
    g.vocab_size = 40;
    if (arch == ModelArch::Llama) g.n_kv_head = 2, g.ffn_hidden = 24;
    Tensor tokens = Tensor::empty({B, T}, DType::I32), targets = Tensor::empty({B, T}, DType::I32);
    for (int64_t i = 0; i < tokens.numel(); ++i) {
      tokens.data_as<int32_t>()[i] = int32_t((i * 7 + 3) % g.vocab_size);
      targets.data_as<int32_t>()[i] = int32_t((i * 11 + 5) % g.vocab_size);
    }
    const double dloss = 1.0 / (double(B) * T);
    // One pass of `model` over `toks` / `tgts`: its loss sum, and its gradients.
    auto run = [&](GPT& model, const Tensor& toks, const Tensor& tgts) {
      Arena records, scratch;
      Activations a = model.alloc_activations(records, B, int(toks.shape()[1]));
      copy_convert(a.tokens, toks);
      copy_convert(a.targets, tgts);
      Tensor loss = Tensor::zeros({1}, DType::F64);
      model.forward(a, dloss, loss);
      model.backward(a, scratch);
      return loss.data_as<double>()[0];
    };
    GPT whole(g, DType::F64);
    whole.init(5, 0.3);
    const double loss_whole = run(whole, tokens, targets);

    GPT part(g, DType::F64);
    part.init(5, 0.3);
    part.set_cp_comm(cp.get());
    Tensor tl = Tensor::empty({B, T / P}, DType::I32), gl = Tensor::empty({B, T / P}, DType::I32);
    zigzag_shard(tl, tokens, P, r);
    zigzag_shard(gl, targets, P, r);
    const double loss_cp = all_reduce_sum(run(part, tl, gl));
    CHECK(std::abs(loss_cp - loss_whole) <= 1e-12 * std::abs(loss_whole));
    Tensor grads = part.grads();
    MPI_Allreduce(MPI_IN_PLACE, grads.data(), int(grads.numel()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double scale = 0;
    for (int64_t i = 0; i < grads.numel(); ++i) scale = std::max(scale, std::abs(whole.grads().data_as<double>()[i]));
    CHECK(max_err(grads, whole.grads(), 0, 1e-11 * scale) <= 1);
  }
}
