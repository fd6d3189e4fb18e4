// Mixed precision above the kernels: the GPT in bf16 and fp16 against fp32 on the same (rounded) weights, the
// optimizer's fp32 masters, loss-scale unscaling and overflow skip, and the data-parallel reduction in bf16
// (registered also on 2 ranks, comm_tests.cmake, with rank-valued gradients whose sums bf16 holds exactly).
#include <catch2/catch.hpp>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "comm/make_communicator.h"
#include "core/arena.h"
#include "model/gpt.h"
#include "optim/optimizer.h"
#include "parallel/grad_buckets.h"
#include "test_support.h"

using namespace mt;

namespace {

// Unit roundoff of each format: a value rounded once to nearest is within u * |x|.
double unit_roundoff(DType t) { return t == DType::BF16 ? 1.0 / 256 : t == DType::F16 ? 1.0 / 2048 : 0x1p-24; }

// fp32 weights ~ N(0, 0.1^2) and gradients ~ N(0, 0.01^2), from `seed`.
void fill_weights_and_grads(const Tensor& weights, const Tensor& grads, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t i = 0; i < weights.numel(); ++i) {
    weights.data_as<float>()[i] = 0.1f * nd(rng);
    grads.data_as<float>()[i] = 0.01f * nd(rng);
  }
}

GPTConfig small_model() {
  GPTConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 32;
  c.seq_len = 16;
  c.vocab_size = 64;
  return c;
}

void fill_batch(Activations& a, int V, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < a.tokens.numel(); ++i) {
    a.tokens.data_as<int32_t>()[i] = int32_t(rng() % V);
    a.targets.data_as<int32_t>()[i] = int32_t(rng() % V);
  }
}

Tensor to_f32(const Tensor& t) {
  Tensor r = Tensor::empty(t.shape(), DType::F32);
  copy_convert(r, t);
  return r;
}

double rel_l2(const Tensor& a, const Tensor& ref) {
  const Tensor x = to_f32(a), y = to_f32(ref);
  double d = 0, n = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double p = x.data_as<float>()[i], q = y.data_as<float>()[i];
    d += (p - q) * (p - q);
    n += q * q;
  }
  return std::sqrt(d / std::max(n, 1e-300));
}

struct Pass {
  double loss;
  Tensor grads;
  size_t record_bytes;
};

// One micro-batch's forward and backward (mean loss over its tokens) of `m`.
Pass run_pass(GPT& m, int B, uint32_t seed) {
  Arena arena, scratch;
  Activations a = m.alloc_activations(arena, B, m.config().seq_len);
  const size_t record_bytes = arena.bytes_in_use();
  fill_batch(a, m.config().vocab_size, seed);
  Tensor sum = Tensor::zeros({1}, DType::F32);
  const double n = double(a.tokens.numel());
  m.forward(a, 1.0 / n, sum);
  m.backward(a, scratch);
  return {sum.data_as<float>()[0] / n, to_f32(m.grads()), record_bytes};
}

}  // namespace

TEST_CASE("the GPT in bf16 and fp16 matches fp32 on the same rounded weights", "[mixed][model]") {
  for (DType t : {DType::BF16, DType::F16}) {
    INFO(dtype_name(t));
    const double u = unit_roundoff(t);
    GPT m16(small_model(), t);
    Tensor masters = Tensor::zeros(m16.params().shape(), DType::F32);
    m16.init(7, 0.02, masters);
    copy_convert(m16.params(), masters);
    GPT m32(small_model(), DType::F32);
    copy_convert(m32.params(), m16.params());  // the reference sees exactly the compute copy's weights
    CHECK(m16.grads().dtype() == DType::F32);  // gradients accumulate in fp32

    const Pass r16 = run_pass(m16, 4, 11), r32 = run_pass(m32, 4, 11);
    // Activations are stored in 16 bits, LayerNorm statistics and losses in fp32: a record takes a little more
    // than half the bytes of the fp32 one.
    CHECK(double(r16.record_bytes) / double(r32.record_bytes) > 0.5);
    CHECK(double(r16.record_bytes) / double(r32.record_bytes) < 0.53);
    // Every stored activation is rounded once to within u relative, on ~20 rounding points along each path (2
    // blocks of LayerNorm, 4 matmuls, attention, GELU, 2 residual adds, then ln_f and the head); the loss itself is
    // computed in fp32. The errors are independent per element and average out over the 64 tokens and the
    // channels: measured 2.5e-5 (bf16) and 3.3e-6 (fp16) relative, so u (one rounding of the loss itself) is a
    // bound with margin, and anything computed in the wrong format or with a mis-scaled value is far beyond it.
    CHECK(std::abs(r16.loss - r32.loss) / r32.loss < u);
    CHECK(std::abs(r16.loss - r32.loss) > 0);  // the roundings happened
    // Gradients: the backward pass keeps its activation gradients in 16 bits too, and each weight gradient sums
    // N products of two rounded factors in fp32. Measured worst relative L2 error per tensor: 2.0 u (bf16),
    // 2.3 u (fp16); bound 4 u. A gradient accumulated in 16 bits, a missed term or a wrong sign is O(1) or at
    // least many u off.
    for (int p = 0; p < m16.table().size(); ++p) {
      const ParamSpec& s = m16.table()[p];
      INFO(s.name);
      CHECK(rel_l2(r16.grads.slice(s.offset, {s.numel()}), r32.grads.slice(s.offset, {s.numel()})) < 4 * u);
    }
  }
}

TEST_CASE("a 16-bit model's gradients accumulate over micro-batches in fp32", "[mixed][model]") {
  GPT m(small_model(), DType::BF16);
  m.init(3, 0.02);
  Arena arena, scratch;
  Activations a = m.alloc_activations(arena, 2, 16);
  Tensor sum = Tensor::zeros({1}, DType::F32);
  auto pass = [&](uint32_t seed) {
    fill_batch(a, 64, seed);
    m.forward(a, 1.0, sum);
    scratch.reset();
    m.backward(a, scratch);
  };
  pass(1);
  const Tensor g1 = to_f32(m.grads());
  zero_(m.grads());
  pass(2);
  const Tensor g2 = to_f32(m.grads());
  zero_(m.grads());
  pass(1);
  pass(2);
  // The sum of two fp32 gradients, rounded once in fp32: identical to the accumulated buffer (the kernels add in
  // fp32 into the fp32 buffer); a 16-bit accumulator would differ by about 2^-8 relative.
  double worst = 0;
  for (int64_t i = 0; i < g1.numel(); ++i) {
    const float want = g1.data_as<float>()[i] + g2.data_as<float>()[i];
    worst = std::max(worst, double(std::abs(m.grads().data_as<float>()[i] - want)) / (std::abs(want) + 1e-12));
  }
  CHECK(worst < 1e-5);  // the GEMM's own fp32 summation order differs between "+= twice" and "a + b"
}

TEST_CASE("optimizer with fp32 masters: the update of fp32 training, rounded once into the compute copy",
          "[mixed][optimizer]") {
  const int64_t n = 1000;
  ParamTable table;
  table.add("w", {n}, {n}, true, Shard{});
  Tensor master32 = Tensor::zeros({n}, DType::F32), grads = Tensor::zeros({n}, DType::F32);
  fill_weights_and_grads(master32, grads, 5);
  OptimizerSettings os;
  os.grad_clip = 0;
  Optimizer ref(param_segments(table), n, DType::F32, Device::CPU, os);
  Optimizer mixed(param_segments(table), n, DType::F32, Device::CPU, os, nullptr, nullptr, nullptr, true);
  Tensor compute = Tensor::zeros({n}, DType::BF16);
  mixed.load_masters(master32);
  copy_convert(compute, master32);
  for (int step = 0; step < 3; ++step) {
    REQUIRE(ref.step(master32, grads, 1e-2));
    REQUIRE(mixed.step(compute, grads, 1e-2));
  }
  Tensor stored = Tensor::zeros({n}, DType::F32), rounded = Tensor::zeros({n}, DType::BF16);
  mixed.store_masters(stored);
  copy_convert(rounded, master32);
  for (int64_t i = 0; i < n; ++i) {
    REQUIRE(stored.data_as<float>()[i] == master32.data_as<float>()[i]);  // masters evolve exactly as fp32 training
    REQUIRE(static_cast<uint16_t*>(compute.data())[i] == static_cast<uint16_t*>(rounded.data())[i]);
  }
  CHECK(mixed.state_bytes() == 3 * n * sizeof(float));  // two moments and the masters
}

TEST_CASE("optimizer over many segments: each run of them in one call gives every segment its own update",
          "[mixed][optimizer]") {
  // Ten segments as a GPT's parameters and ZeRO-1's shards lie: decay alternating in twos, the state packed except
  // for one gap (segment 6's state lies elsewhere), one segment outside the norm (the last stage's tied wte).
  // The optimizer merges what lies end to end into one kernel call; the result must be what one call per segment
  // gives, bit for bit, and the norm the sum over the segments in the norm.
  const int64_t per = 37, nseg = 10, n = per * nseg, state_n = n + 50;
  std::vector<OptimSegment> segs;
  for (int64_t i = 0; i < nseg; ++i)
    segs.push_back({i * per, i == 6 ? n + 5 : i * per, per, (i / 2) % 2 == 0, false, i != 8});
  Tensor master32 = Tensor::zeros({n}, DType::F32), grads = Tensor::zeros({n}, DType::F32);
  fill_weights_and_grads(master32, grads, 11);
  OptimizerSettings os;
  os.grad_clip = 0;  // the scale is then exactly 1: the reference below needs no norm
  Optimizer opt(segs, state_n, DType::F32, Device::CPU, os, nullptr, nullptr, nullptr, true);
  Tensor compute = Tensor::zeros({n}, DType::BF16);
  opt.load_masters(master32);
  copy_convert(compute, master32);
  Tensor m = Tensor::zeros({n}, DType::F32), v = Tensor::zeros({n}, DType::F32), one = Tensor::zeros({1}, DType::F32);
  one.data_as<float>()[0] = 1.f;
  for (int step = 1; step <= 3; ++step) {
    REQUIRE(opt.step(compute, grads, 1e-2));
    kernels::AdamWHyper h;
    h.lr = 1e-2, h.beta1 = os.beta1, h.beta2 = os.beta2, h.eps = os.eps, h.step = step;
    for (const OptimSegment& g : segs) {
      h.weight_decay = g.decay ? os.weight_decay : 0.0;
      kernels::adamw_update(master32.slice(g.offset, {per}), grads.slice(g.offset, {per}), m.slice(g.offset, {per}),
                            v.slice(g.offset, {per}), one, h);
    }
  }
  Tensor stored = Tensor::zeros({n}, DType::F32), rounded = Tensor::zeros({n}, DType::BF16);
  opt.store_masters(stored);
  copy_convert(rounded, master32);
  for (int64_t i = 0; i < n; ++i) {
    REQUIRE(stored.data_as<float>()[i] == master32.data_as<float>()[i]);
    REQUIRE(static_cast<uint16_t*>(compute.data())[i] == static_cast<uint16_t*>(rounded.data())[i]);
  }
  double sq = 0;
  for (const OptimSegment& g : segs)
    for (int64_t i = g.offset; g.in_norm && i < g.offset + per; ++i)
      sq += double(grads.data_as<float>()[i]) * grads.data_as<float>()[i];
  CHECK(opt.grad_norm().data_as<float>()[0] == Approx(std::sqrt(sq)).epsilon(1e-6));
}

TEST_CASE("optimizer over packed parameters (ZeRO-3): the update of the same segments in the unpacked layout",
          "[mixed][optimizer][zero]") {
  // Four segments at scattered offsets of a 400-element layout, their state (and the packed gradients and
  // parameters) end to end: a rank's shards. fp32 updates the packed parameters in place; bf16 keeps masters,
  // loaded piece by piece as the trainer's sharded initialisation loads them, and rounds into the packed copy.
  const int64_t per = 30, n = 400;
  std::vector<OptimSegment> segs;
  for (int64_t i = 0; i < 4; ++i) segs.push_back({i * 97 + 5, i * per, per, i % 2 == 0, false, true});
  Tensor weights = Tensor::zeros({n}, DType::F32), grads = Tensor::zeros({n}, DType::F32);
  fill_weights_and_grads(weights, grads, 7);
  Tensor packed_grads = Tensor::zeros({4 * per}, DType::F32);
  for (const OptimSegment& g : segs)
    copy_convert(packed_grads.slice(g.state_offset, {per}), grads.slice(g.offset, {per}));
  for (const DType dt : {DType::F32, DType::BF16}) {
    INFO(dtype_name(dt));
    const bool mixed = dt != DType::F32;
    OptimizerSettings flat_os, packed_os;
    packed_os.packed_grads = packed_os.packed_params = true;
    Optimizer flat(segs, 4 * per, DType::F32, Device::CPU, flat_os, nullptr, nullptr, nullptr, mixed);
    Optimizer packed(segs, 4 * per, DType::F32, Device::CPU, packed_os, nullptr, nullptr, nullptr, mixed);
    Tensor full = Tensor::zeros({n}, dt), shards = Tensor::zeros({4 * per}, dt);
    copy_convert(full, weights);
    for (const OptimSegment& g : segs) copy_convert(shards.slice(g.state_offset, {per}), full.slice(g.offset, {per}));
    if (mixed) {
      flat.load_masters(weights);
      for (int64_t at = 0; at < n; at += 50) packed.load_masters(weights.slice(at, {50}), at);
    }
    for (int step = 0; step < 3; ++step) {
      REQUIRE(flat.step(full, grads, 1e-2));
      REQUIRE(packed.step(shards, packed_grads, 1e-2));
    }
    CHECK(packed.last_grad_norm() == flat.last_grad_norm());
    Tensor from_flat = Tensor::zeros({n}, DType::F32), from_packed = Tensor::zeros({n}, DType::F32);
    flat.store_weights(from_flat, full);
    packed.store_weights(from_packed, shards);
    CHECK(std::memcmp(from_flat.data(), from_packed.data(), from_flat.nbytes()) == 0);
    for (const OptimSegment& g : segs)
      CHECK(std::memcmp(shards.slice(g.state_offset, {per}).data(), full.slice(g.offset, {per}).data(),
                        per * dtype_size(dt)) == 0);
  }
}

TEST_CASE("optimizer: a loss scale is divided out exactly, and a non-finite norm skips the step and changes nothing",
          "[mixed][optimizer][loss_scaler]") {
  const int64_t n = 64;
  ParamTable table;
  table.add("w", {n}, {n}, true, Shard{});
  Tensor p1 = Tensor::zeros({n}, DType::F32), p2 = Tensor::zeros({n}, DType::F32);
  Tensor g = Tensor::zeros({n}, DType::F32), g_scaled = Tensor::zeros({n}, DType::F32);
  for (int64_t i = 0; i < n; ++i) {
    p1.data_as<float>()[i] = p2.data_as<float>()[i] = 0.01f * float(i % 7);
    g.data_as<float>()[i] = 0.5f * float(i % 5) - 1.0f;
    g_scaled.data_as<float>()[i] = g.data_as<float>()[i] * 65536.0f;  // a power of two: exact
  }
  OptimizerSettings os;
  os.grad_clip = 1.0;  // the norm (sqrt(sum g^2) ~ 5.7) is clipped, so the clip coefficient is unscaled too
  Optimizer a(param_segments(table), n, DType::F32, Device::CPU, os), b(param_segments(table), n, DType::F32,
                                                                         Device::CPU, os);
  REQUIRE(a.step(p1, g, 1e-2));
  REQUIRE(b.step(p2, g_scaled, 1e-2, 65536.0));
  CHECK(b.grad_norm().data_as<float>()[0] == Approx(a.grad_norm().data_as<float>()[0]).epsilon(1e-6));
  for (int64_t i = 0; i < n; ++i)
    CHECK(p2.data_as<float>()[i] == Approx(p1.data_as<float>()[i]).epsilon(1e-6).margin(1e-9));

  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    Tensor before = to_f32(p2);
    g_scaled.data_as<float>()[3] = bad;
    CHECK_FALSE(b.step(p2, g_scaled, 1e-2, 65536.0));
    CHECK(b.steps_taken() == 1);  // AdamW's bias correction does not count a skipped step
    CHECK(!std::isfinite(b.grad_norm().data_as<float>()[0]));
    for (int64_t i = 0; i < n; ++i) REQUIRE(p2.data_as<float>()[i] == before.data_as<float>()[i]);
  }
  // After the skips the moments are untouched: the next finite step equals the first optimizer's second step.
  g_scaled.data_as<float>()[3] = g.data_as<float>()[3] * 65536.0f;
  REQUIRE(a.step(p1, g, 1e-2));
  REQUIRE(b.step(p2, g_scaled, 1e-2, 65536.0));
  for (int64_t i = 0; i < n; ++i)
    CHECK(p2.data_as<float>()[i] == Approx(p1.data_as<float>()[i]).epsilon(1e-6).margin(1e-9));
}

TEST_CASE("gradient buckets reduced in bf16: half the bytes, rank-valued sums exact, back in fp32", "[mixed][reducer]") {
  CommOptions o;
  o.timeout_s = 60;
  auto dp = make_communicator(MPI_COMM_WORLD, "dp", o);
  const int P = dp->size(), r = dp->rank();
  ParamTable table;
  table.add("a", {300}, {300}, true, Shard{});
  table.add("b", {77}, {77}, false, Shard{});
  table.add("c", {500}, {500}, true, Shard{});
  const int64_t n = table.total_numel();
  for (bool zero : {false, true}) {
    INFO("zero " << zero);
    Tensor grads = Tensor::zeros({n}, DType::F32);
    // Element i on rank r: (i % 13 + r) / 8 + 1/3 on rank 0 only. The rank-valued part sums exactly in bf16
    // (small multiples of 1/8); 1/3 is not a bf16 number, so the result shows the one rounding on the wire.
    for (int64_t i = 0; i < n; ++i) grads.data_as<float>()[i] = float((i % 13 + r) / 8.0 + (r == 0 ? 1.0 / 3 : 0.0));
    GradReducer red(*dp, grads, make_buckets_within(table, 0, n, 4, 600 * 4.0), zero, DType::BF16);
    REQUIRE(red.wire_dtype() == DType::BF16);
    REQUIRE(red.buckets().size() == 2);
    int64_t sent = 0;
    dp->set_event_sink([&](const CommEvent& e) { sent += e.bytes; });
    red.begin_micro_batch(true);
    red.grads_ready(n);
    red.finish();
    dp->barrier();
    dp->set_event_sink({});
    CHECK(sent == 2 * n);  // 2 bytes per gradient on the wire
    for (int b = 0; b < 2; ++b) {
      const Bucket& k = red.buckets()[b];
      const int64_t lo = zero ? k.begin + red.shard(b).begin : k.begin, hi = zero ? lo + red.shard(b).size() : k.end;
      for (int64_t i = lo; i < hi; ++i) {
        double exact = 1.0 / 3;
        for (int q = 0; q < P; ++q) exact += (i % 13 + q) / 8.0;
        exact /= P;
        // The bf16 value sent by rank 0 is rounded (relative u = 2^-8 of its ~1); the average of exact bf16 sums
        // is rounded once more when P is not a power of two. 2u of the largest term bounds both.
        const double got = grads.data_as<float>()[i];
        REQUIRE(std::abs(got - exact) <= 2.0 / 256 * (i % 13 / 8.0 + P));
        REQUIRE(got != float(exact));  // the value went through bf16: it is not the fp32 average
      }
    }
  }
}
