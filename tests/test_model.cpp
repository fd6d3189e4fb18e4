// The whole GPT: a finite-difference gradient check in double precision, gradient accumulation, mesh-independent
// initialisation, safetensors import/export, an allocation-free steady state, and parameters read through views
// only when the passes ask for them (ZeRO-3).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include "core/errors.h"
#include "core/philox.h"
#include "model/gpt.h"
#include "model/safetensors.h"
#include "test_support.h"

using namespace mt;

namespace {

GPTConfig tiny() {
  GPTConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 8;
  c.seq_len = 5;
  c.vocab_size = 11;  // padded to 64: the padding must never change the loss or get a gradient
  return c;
}

void fill_batch(Activations& a, int V, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < a.tokens.numel(); ++i) {
    a.tokens.data_as<int32_t>()[i] = int32_t(rng() % V);
    a.targets.data_as<int32_t>()[i] = int32_t(rng() % V);
  }
}

// Mean loss of the batch in `a` (forward only).
double mean_loss(const GPT& m, Activations& a) {
  Tensor sum = Tensor::zeros({1}, DType::F64);
  m.forward(a, 0.0, sum);
  return sum.data_as<double>()[0] / double(a.tokens.numel());
}

std::string temp_path(const std::string& name) { return mt::test::tmp_path("model", name); }

}  // namespace

TEST_CASE("whole GPT gradient matches central finite differences in fp64", "[model][gradcheck]") {
  GPT m(tiny(), DType::F64);
  m.init(7, 0.3);  // a large std so every path (attention, GELU curvature) contributes visibly
  // Perturb LayerNorm weights and biases away from 1/0 so their gradients are generic.
  for (int p = 0; p < m.table().size(); ++p) {
    const ParamSpec& s = m.table()[p];
    double* w = m.param(p).data_as<double>();
    for (int64_t i = 0; i < s.full_shape.numel(); ++i) w[i] += 0.1 * philox_normal(99, p, i);
  }
  Arena arena, scratch;
  Activations a = m.alloc_activations(arena, 2, 5);
  fill_batch(a, 11, 1);
  Tensor sum = Tensor::zeros({1}, DType::F64);
  const double dloss = 1.0 / double(a.tokens.numel());
  zero_(m.grads());
  m.forward(a, dloss, sum);
  m.backward(a, scratch);

  // Central differences in fp64 with h = 1e-6: truncation error O(h^2 * f''') ~ 1e-12 and rounding error
  // O(eps * |f| / h) ~ 1e-10 absolute; a wrong gradient formula is off by O(|g|). Tolerance 1e-6 relative
  // to max(|g|, 1e-3), i.e. absolute 1e-9 for tiny gradients.
  const double h = 1e-6;
  int checked = 0;
  for (int p = 0; p < m.table().size(); ++p) {
    const ParamSpec& s = m.table()[p];
    double* w = m.param(p).data_as<double>();
    const double* g = m.grad(p).data_as<double>();
    const int64_t n = s.full_shape.numel();
    for (int64_t k = 0; k < std::min<int64_t>(n, 12); ++k) {
      const int64_t i = (k * 7919) % n;  // spread over the tensor
      const double w0 = w[i];
      w[i] = w0 + h;
      const double up = mean_loss(m, a);
      w[i] = w0 - h;
      const double down = mean_loss(m, a);
      w[i] = w0;
      const double numeric = (up - down) / (2 * h);
      INFO(s.name << "[" << i << "] analytic " << g[i] << " numeric " << numeric);
      CHECK(std::abs(g[i] - numeric) <= 1e-6 * std::max(std::abs(numeric), 1e-3));
      ++checked;
    }
    // Padding rows of the token embedding: exactly zero gradient.
    for (int64_t i = n; i < s.numel(); ++i) REQUIRE(g[i] == 0.0);
  }
  CHECK(checked > 100);
}

TEST_CASE("padding the vocabulary does not change the loss", "[model]") {
  // The same weights with vocab 11 padded to 64, and nonzero junk in the padding rows: same loss.
  GPT m(tiny(), DType::F64);
  m.init(3, 0.2);
  Arena arena;
  Activations a = m.alloc_activations(arena, 2, 5);
  fill_batch(a, 11, 2);
  const double before = mean_loss(m, a);
  Tensor wte = m.param("wte.weight");
  for (int64_t i = 11 * 8; i < wte.numel(); ++i) wte.data_as<double>()[i] = 5.0;
  CHECK(mean_loss(m, a) == before);
}

TEST_CASE("gradients accumulate over micro-batches", "[model]") {
  // One micro-batch of 4 sequences == two of 2 with the same loss scale, to fp64 rounding (1e-12 relative).
  GPT m(tiny(), DType::F64);
  m.init(5, 0.2);
  Arena arena, scratch;
  Activations big = m.alloc_activations(arena, 4, 5);
  fill_batch(big, 11, 3);
  Tensor sum = Tensor::zeros({1}, DType::F64);
  const double dloss = 1.0 / 20;
  zero_(m.grads());
  m.forward(big, dloss, sum);
  m.backward(big, scratch);
  std::vector<double> once(m.grads().data_as<double>(), m.grads().data_as<double>() + m.grads().numel());
  const double loss_once = sum.data_as<double>()[0];

  Activations half = m.alloc_activations(arena, 2, 5);
  zero_(m.grads());
  zero_(sum);
  for (int part = 0; part < 2; ++part) {
    for (int64_t i = 0; i < 10; ++i) {
      half.tokens.data_as<int32_t>()[i] = big.tokens.data_as<int32_t>()[part * 10 + i];
      half.targets.data_as<int32_t>()[i] = big.targets.data_as<int32_t>()[part * 10 + i];
    }
    m.forward(half, dloss, sum);
    scratch.reset();
    m.backward(half, scratch);
  }
  CHECK(sum.data_as<double>()[0] == Approx(loss_once).epsilon(1e-12));
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < once.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(once[i] - m.grads().data_as<double>()[i]));
    max_abs = std::max(max_abs, std::abs(once[i]));
  }
  CHECK(max_diff <= 1e-12 * max_abs);
}

TEST_CASE("initialisation is a function of (seed, name, element) only", "[model][init]") {
  GPT m(tiny(), DType::F32);
  m.init(1234, 0.02);
  const double proj = 0.02 / std::sqrt(4.0);
  auto expect = [&](const std::string& name, int64_t i, double sd) {
    return float(sd * philox_normal(1234, fnv1a64(name), uint64_t(i)));
  };
  CHECK(m.param("h.1.attn.c_attn.weight").data_as<float>()[17] == expect("h.1.attn.c_attn.weight", 17, 0.02));
  CHECK(m.param("h.0.mlp.c_proj.weight").data_as<float>()[5] == expect("h.0.mlp.c_proj.weight", 5, proj));
  CHECK(m.param("wte.weight").data_as<float>()[10 * 8 + 3] == expect("wte.weight", 10 * 8 + 3, 0.02));
  CHECK(m.param("wte.weight").data_as<float>()[11 * 8] == 0.0f);  // padding row
  CHECK(m.param("h.0.ln_1.weight").data_as<float>()[0] == 1.0f);
  CHECK(m.param("h.0.attn.c_attn.bias").data_as<float>()[0] == 0.0f);
  // A different seed gives different weights.
  GPT m2(tiny(), DType::F32);
  m2.init(1235, 0.02);
  CHECK(m2.param("wpe.weight").data_as<float>()[0] != m.param("wpe.weight").data_as<float>()[0]);
}

TEST_CASE("safetensors export and import round-trip, with or without the transformer. prefix", "[model][io]") {
  GPT a(tiny(), DType::F32);
  a.init(42, 0.02);
  const std::string path = temp_path("roundtrip.safetensors");
  a.export_safetensors(path);
  GPT b(tiny(), DType::F32);
  b.load_safetensors(path);
  for (int64_t i = 0; i < a.params().numel(); ++i)
    REQUIRE(a.params().data_as<float>()[i] == b.params().data_as<float>()[i]);

  // Re-write with the prefix on every name, a causal-mask buffer and a tied lm_head: all accepted.
  SafetensorsFile f = SafetensorsFile::open(path);
  std::vector<std::vector<float>> keep;
  std::vector<SafetensorOut> outs;
  for (const auto& info : f.tensors()) {
    int64_t n = 1;
    for (auto d : info.shape) n *= d;
    keep.emplace_back(n);
    f.read_as_float(info, keep.back().data(), n);
  }
  size_t k = 0;
  for (const auto& info : f.tensors()) outs.push_back({"transformer." + info.name, DType::F32, info.shape, keep[k++].data()});
  std::vector<float> mask(25, 1.0f);
  outs.push_back({"transformer.h.0.attn.bias", DType::F32, {1, 1, 5, 5}, mask.data()});
  // The tied head, written as checkpoints often carry it (ignored by the loader): wte's values and shape.
  const SafetensorInfo* wte = f.find("wte.weight");
  REQUIRE(wte != nullptr);
  outs.push_back({"lm_head.weight", DType::F32, wte->shape, keep[size_t(wte - f.tensors().data())].data()});
  const std::string prefixed = temp_path("prefixed.safetensors");
  write_safetensors(prefixed, outs);
  GPT c(tiny(), DType::F32);
  c.load_safetensors(prefixed);
  for (int64_t i = 0; i < a.params().numel(); ++i)
    REQUIRE(a.params().data_as<float>()[i] == c.params().data_as<float>()[i]);

  // A missing tensor, an unknown tensor and a wrong shape are each refused with the name in the message.
  std::vector<SafetensorOut> missing(outs.begin() + 1, outs.end());
  write_safetensors(prefixed, missing);
  CHECK_THROWS_WITH(c.load_safetensors(prefixed), Catch::Contains("missing"));
  std::vector<SafetensorOut> unknown = outs;
  unknown.push_back({"h.9.ln_1.weight", DType::F32, {8}, keep[0].data()});
  write_safetensors(prefixed, unknown);
  CHECK_THROWS_WITH(c.load_safetensors(prefixed), Catch::Contains("h.9.ln_1.weight"));
  std::vector<SafetensorOut> misshaped = outs;
  for (auto& o : misshaped)
    if (o.name == "transformer.ln_f.weight") o.shape = {2, 4};
  write_safetensors(prefixed, misshaped);
  CHECK_THROWS_AS(c.load_safetensors(prefixed), InputError);
  std::remove(path.c_str());
  std::remove(prefixed.c_str());
}

TEST_CASE("a steady-state step allocates no arena memory", "[model][arena]") {
  GPT m(tiny(), DType::F32);
  m.init(1, 0.02);
  Arena arena, scratch;
  Activations a = m.alloc_activations(arena, 2, 5);
  Tensor sum = Tensor::zeros({1}, DType::F32);
  auto step = [&] {
    fill_batch(a, 11, 4);
    m.forward(a, 0.1, sum);
    scratch.reset();
    m.backward(a, scratch);
  };
  step();
  const size_t blocks = arena.block_allocations() + scratch.block_allocations();
  for (int i = 0; i < 3; ++i) step();
  CHECK(arena.block_allocations() + scratch.block_allocations() == blocks);
}

TEST_CASE("init_from accepts BF16 and F16 files", "[model][io]") {
  // Each value must load as exactly the float the 16-bit value denotes (conversion is exact widening).
  GPT a(tiny(), DType::F32);
  a.init(9, 0.02);
  for (DType half : {DType::BF16, DType::F16}) {
    std::vector<std::vector<uint16_t>> keep;
    std::vector<SafetensorOut> outs;
    for (const ParamSpec& s : a.table().specs()) {
      const int64_t n = s.full_shape.numel();
      keep.emplace_back(n);
      Tensor dst(keep.back().data(), {n}, half);
      copy_convert(dst, a.params().slice(s.offset, {n}));
      outs.push_back({s.name, half, std::vector<int64_t>(s.full_shape.d.begin(), s.full_shape.d.begin() + s.full_shape.n),
                      keep.back().data()});
    }
    const std::string path = temp_path("half.safetensors");
    write_safetensors(path, outs);
    GPT b(tiny(), DType::F32);
    b.load_safetensors(path);
    for (int p = 0; p < a.table().size(); ++p) {
      const ParamSpec& s = a.table()[p];
      for (int64_t i = 0; i < s.full_shape.numel(); ++i) {
        const uint16_t h = keep[p][i];
        const float want = half == DType::BF16 ? bf16_to_float(h) : fp16_to_float(h);
        REQUIRE(b.param(p).data_as<float>()[i] == want);
      }
    }
    std::remove(path.c_str());
  }
}

TEST_CASE("a model whose parameters live in views reads each one only after its pass asked for it", "[model][zero]") {
  // ZeRO-3's contract (GPT::set_param_views): the views hold NaN except what the hooks copied in, the forward hook's
  // elements [begin, previous begin) and the backward hook's [begin, end), and the views are poisoned again between
  // the passes (the gathered blocks freed after the forward). Any read before its request would make the loss or a
  // gradient NaN; the passes must give exactly the flat model's numbers.
  struct Case {
    const char* name;
    ModelArch arch;
    Recompute recompute;
    bool split;
  };
  for (const Case& k : {Case{"gpt2 full", ModelArch::GPT2, Recompute::Full, false},
                        Case{"gpt2 light split", ModelArch::GPT2, Recompute::Light, true},
                        Case{"llama selective", ModelArch::Llama, Recompute::Selective, false},
                        Case{"llama split", ModelArch::Llama, Recompute::None, true}}) {
    INFO(k.name);
    GPTConfig c = tiny();
    c.arch = k.arch;
    c.recompute = k.recompute;
    if (k.arch == ModelArch::Llama) c.n_kv_head = 1, c.multiple_of = 8;
    GPT flat(c, DType::F64), viewed(c, DType::F64);
    flat.init(7, 0.2);
    copy_convert(viewed.params(), flat.params());
    const int64_t n = flat.params().numel();
    Tensor shadow = Tensor::zeros({n}, DType::F64);
    auto poison = [&] { std::fill(shadow.data_as<double>(), shadow.data_as<double>() + n, std::nan("")); };
    auto fetch = [&](int64_t lo, int64_t hi) {
      REQUIRE((0 <= lo && lo <= hi && hi <= n));
      std::copy(viewed.params().data_as<double>() + lo, viewed.params().data_as<double>() + hi,
                shadow.data_as<double>() + lo);
    };
    std::vector<Tensor> views;
    for (const ParamSpec& s : viewed.table().specs()) views.push_back(shadow.slice(s.offset, s.shape));
    viewed.set_param_views(views);

    Arena arena, scratch;
    auto step = [&](GPT& m, bool hooked) {
      Activations a = m.alloc_activations(arena, 2, 5, k.split);
      fill_batch(a, 11, 9);
      Tensor sum = Tensor::zeros({1}, DType::F64);
      zero_(m.grads());
      int64_t end = n, requests = 0;
      if (hooked) poison();
      m.forward(a, 0.1, sum, hooked ? std::function<void(int64_t)>([&](int64_t begin) {
        if (begin < end) fetch(begin, end), end = begin;
      }) : std::function<void(int64_t)>());
      const ParamsNeeded need = [&](int64_t lo, int64_t hi) { fetch(lo, hi), ++requests; };
      if (hooked) poison();
      scratch.reset();
      m.backward(a, scratch, {}, k.split ? BackwardPart::InputOnly : BackwardPart::All, {}, {},
                 hooked ? need : ParamsNeeded());
      if (k.split) {
        if (hooked) poison();
        m.backward_weights(a, {}, hooked ? need : ParamsNeeded());
      }
      if (hooked) CHECK(requests >= c.n_layer + 1);  // the head, then every block
      return sum.data_as<double>()[0];
    };
    const double want = step(flat, false), got = step(viewed, true);
    CHECK(got == want);
    CHECK(std::memcmp(viewed.grads().data(), flat.grads().data(), flat.grads().nbytes()) == 0);
  }
}
