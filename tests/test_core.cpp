// Core: reduced-precision conversions (round to nearest even, as the GPU does), the Philox generator against the
// published known-answer vectors, tensor views, the arena, the learning-rate schedules, and the energy counters.
#include <catch2/catch.hpp>

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/arena.h"
#include "core/dtype.h"
#include "core/energy.h"
#include "core/gpu_energy.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "optim/lr_schedule.h"
#include "test_support.h"

using namespace mt;

TEST_CASE("the portable fp16 conversion matches the CPU's F16C instructions bit for bit", "[dtype]") {
  // Every 97th fp32 bit pattern (44 million values: all exponents, subnormals, inf, NaN); F16C rounds to
  // nearest even in hardware, so it is an exact reference for our software conversion.
  int64_t mismatches = 0;
  for (uint64_t u = 0; u < (1ull << 32); u += 97) {
    const float f = bits_float(static_cast<uint32_t>(u));
    const uint16_t ours = float_to_fp16_portable(f), hw = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    if (std::isnan(f)) mismatches += ((ours & 0x7c00) != 0x7c00) || !(ours & 0x3ff);
    else mismatches += ours != hw;
  }
  CHECK(mismatches == 0);
  for (uint32_t h = 0; h < 65536; ++h) {
    const float ours = fp16_to_float_portable(static_cast<uint16_t>(h)), hw = _cvtsh_ss(static_cast<uint16_t>(h));
    if (!std::isnan(hw)) REQUIRE(float_bits(ours) == float_bits(hw));
  }
}

TEST_CASE("bf16 conversion rounds to nearest even", "[dtype]") {
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  // 1 + 2^-8 is exactly half-way between bf16 neighbours 1 and 1 + 2^-7: ties go to the even mantissa (1).
  CHECK(float_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);
  // 1 + 3 * 2^-8 is half-way between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up to the even one.
  CHECK(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);
  CHECK(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)) == 0x3f81);  // above half: up
  CHECK(bf16_to_float(float_to_bf16(-3.5f)) == -3.5f);
  CHECK(std::isinf(bf16_to_float(float_to_bf16(INFINITY))));
  CHECK(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  CHECK(float_to_bf16(3.4e38f) == 0x7f80);  // rounds past the largest bf16 to inf, as round-to-nearest must
  // Every bf16 value converts back to itself.
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    if (!std::isnan(f)) REQUIRE(float_to_bf16(f) == h);
  }
}

TEST_CASE("Philox4x32-10 reproduces the Random123 known-answer vectors", "[philox]") {
  // From Random123's kat_vectors (philox4x32_10).
  auto r = philox4x32({0, 0, 0, 0}, {0, 0});
  CHECK(r == PhiloxCounter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  r = philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  CHECK(r == PhiloxCounter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  r = philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u});
  CHECK(r == PhiloxCounter{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("philox_normal has standard normal moments", "[philox]") {
  // 1e6 draws: the mean's standard error is 1e-3 and the variance's ~1.4e-3; 5 sigma bounds.
  double s = 0, s2 = 0;
  const int n = 1000000;
  for (int i = 0; i < n; ++i) {
    const double x = philox_normal(1234, 77, i);
    s += x;
    s2 += x * x;
  }
  CHECK(std::abs(s / n) < 5e-3);
  CHECK(std::abs(s2 / n - 1.0) < 7e-3);
  CHECK(philox_normal(1, 2, 3) == philox_normal(1, 2, 3));
  CHECK(philox_normal(1, 2, 3) != philox_normal(1, 3, 3));
}

TEST_CASE("tensor views, slices and converting copies", "[tensor]") {
  Tensor t = Tensor::empty({2, 3, 4}, DType::F32);
  CHECK(t.numel() == 24);
  CHECK(t.nbytes() == 96);
  CHECK(reinterpret_cast<uintptr_t>(t.data()) % 64 == 0);
  for (int i = 0; i < 24; ++i) t.data_as<float>()[i] = float(i) + 0.25f;
  Tensor v = t.view({6, 4});
  CHECK(v.dim(-1) == 4);
  CHECK(v.data() == t.data());
  Tensor s = t.slice(5, {3});
  CHECK(s.data_as<float>()[0] == 5.25f);
  Tensor h = Tensor::empty({24}, DType::BF16);
  copy_convert(h, t);
  Tensor back = Tensor::empty({24}, DType::F64);
  copy_convert(back, h);
  CHECK(back.data_as<double>()[3] == 3.25);  // exact in bf16
  zero_(t);
  CHECK(t.data_as<float>()[23] == 0.0f);
}

TEST_CASE("the arena reuses its memory after reset", "[arena]") {
  Arena a(Device::CPU, 1 << 20);
  Tensor x = a.alloc({1000}, DType::F32);
  Tensor y = a.alloc({300000}, DType::F32);  // larger than a block: gets its own
  CHECK(reinterpret_cast<uintptr_t>(x.data()) % 64 == 0);
  CHECK(reinterpret_cast<uintptr_t>(y.data()) % 64 == 0);
  const size_t blocks = a.block_allocations();
  a.reset();
  CHECK(a.alloc({1000}, DType::F32).data() == x.data());
  CHECK(a.alloc({300000}, DType::F32).data() == y.data());
  CHECK(a.block_allocations() == blocks);
  CHECK(a.high_water_bytes() >= (1000 + 300000) * 4);
}

TEST_CASE("learning-rate schedules", "[lr]") {
  LRSchedule s{LRDecay::Cosine, 1.0, 0.1, 10, 110};
  CHECK(s.at(1) == Approx(0.1));   // linear warmup from lr/warmup
  CHECK(s.at(10) == Approx(1.0));  // peak at the end of warmup
  CHECK(s.at(60) == Approx(0.55)); // half-way through the decay: (lr + min_lr) / 2
  CHECK(s.at(110) == Approx(0.1)); // min_lr at the last step
  LRSchedule lin{LRDecay::Linear, 1.0, 0.0, 0, 100};
  CHECK(lin.at(25) == Approx(0.75));
  CHECK(lin.at(100) == Approx(0.0).margin(1e-12));
  LRSchedule flat{LRDecay::Constant, 0.3, 0.0, 5, 100};
  CHECK(flat.at(5) == Approx(0.3));
  CHECK(flat.at(77) == Approx(0.3));
}

TEST_CASE("energy counters: packages summed, sub-domains left out, one wrap, and none without a powercap folder",
          "[energy]") {
  namespace fs = std::filesystem;
  const fs::path root = test::tmp_path("core", "powercap");
  fs::remove_all(root);
  auto write = [&](const std::string& domain, const std::string& file, uint64_t v) {
    fs::create_directories(root / domain);
    std::ofstream(root / domain / file) << v << "\n";
  };
  for (const char* d : {"intel-rapl:0", "intel-rapl:1", "intel-rapl:0:0"}) {
    write(d, "max_energy_range_uj", 1000000);
    write(d, "energy_uj", 100);
  }
  EnergyMeter m(root.string());
  REQUIRE(m.available());
  write("intel-rapl:0", "energy_uj", 400100);   // +0.4 J
  write("intel-rapl:1", "energy_uj", 200100);   // +0.2 J
  write("intel-rapl:0:0", "energy_uj", 900000);  // part of package 0: not counted twice
  CHECK(m.joules() == Approx(0.6));
  write("intel-rapl:0", "energy_uj", 100);  // wrapped at 1 J: +0.6 J
  CHECK(m.joules() == Approx(0.6));
  CHECK(m.joules() == 0);

  EnergyMeter none((root / "missing").string());
  CHECK_FALSE(none.available());
  CHECK(none.why_unavailable().find("does not exist") != std::string::npos);
  CHECK(none.joules() == 0);
}

TEST_CASE("GPU energy counters: every GPU NVML lists summed, and none without the library", "[energy]") {
  GpuEnergyMeter m(MT_FAKE_NVML);  // two GPUs, +1.5 J and +2.5 J per read (tests/fake_nvml.cpp)
  REQUIRE(m.available());
  CHECK(m.gpus() == 2);
  CHECK(m.joules() == Approx(4.0));  // since construction's read
  CHECK(m.joules() == Approx(4.0));

  GpuEnergyMeter missing("/nonexistent/libnvidia-ml.so.1");
  CHECK_FALSE(missing.available());
  CHECK(missing.why_unavailable().find("cannot be opened") != std::string::npos);
  CHECK(missing.joules() == 0);
  GpuEnergyMeter not_nvml("libm.so.6");  // a library, but not NVML
  CHECK_FALSE(not_nvml.available());
  CHECK(not_nvml.why_unavailable().find("lacks NVML's functions") != std::string::npos);
}
