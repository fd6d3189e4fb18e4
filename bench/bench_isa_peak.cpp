// bench_isa_peak: one core's peak rate of the two instructions a CPU matmul can be built on: the fp32 FMA
// (vfmadd231ps zmm, 32 flops) and, where the CPU has AVX512-BF16, the bf16 dot product (vdpbf16ps zmm, 64 flops
// with fp32 accumulation). Their ratio bounds what a bf16 GEMM without AMX can gain over fp32, and it is why
// train.cpu_matmul=auto keeps bf16 on fp32 widening on Intel CPUs without AMX (kernels/cpu/matmul_backend.cpp).
// 24 independent accumulators hide the latency of either instruction, so the loops measure throughput.
//
//   build/bench/bench_isa_peak [seconds_per_instruction=1]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "bench_args.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kChains = 24;

double g_seconds = 1;  // per instruction

// Stores the accumulators where the compiler cannot drop them, so the loops that produced them stay.
volatile float g_sink;
__attribute__((target("avx512f"))) void keep(const __m512* acc) {
  alignas(64) float lanes[16];
  for (int k = 0; k < kChains; ++k) _mm512_store_ps(lanes, acc[k]), g_sink = g_sink + lanes[0];
}

// Batches of 2^20 iterations (kChains instructions each, a few ms) for g_seconds; the best batch's seconds per
// iteration (the one least disturbed by other processes).
template <class Body>
double best_per_iter(Body body) {
  const long batch = 1L << 20;
  double best = 1e30, total = 0;
  while (total < g_seconds) {
    const auto t0 = Clock::now();
    body(batch);
    const double el = std::chrono::duration<double>(Clock::now() - t0).count();
    total += el, best = std::min(best, el / batch);
  }
  return best;
}

__attribute__((target("avx512f"))) double fma_gflops() {
  __m512 acc[kChains];
  for (int k = 0; k < kChains; ++k) acc[k] = _mm512_set1_ps(1e-9f * k);
  const __m512 x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(1e-9f);
  const double s = best_per_iter([&](long n) {
    for (long i = 0; i < n; ++i)
#pragma GCC unroll 24
      for (int k = 0; k < kChains; ++k) acc[k] = _mm512_fmadd_ps(x, y, acc[k]);
  });
  keep(acc);
  return kChains * 32 / s * 1e-9;
}

__attribute__((target("avx512f,avx512bf16"))) double dpbf16_gflops() {
  __m512 acc[kChains];
  for (int k = 0; k < kChains; ++k) acc[k] = _mm512_set1_ps(1e-9f * k);
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3000);  // 1, 2^-31
  const double s = best_per_iter([&](long n) {
    for (long i = 0; i < n; ++i)
#pragma GCC unroll 24
      for (int k = 0; k < kChains; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], x, y);
  });
  keep(acc);
  return kChains * 64 / s * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2 || (argc == 2 && !mt::bench::arg_number(argv[1], 1e-3, 3600, &g_seconds)))
    mt::bench::usage_exit("bench_isa_peak", "bad arguments", "bench_isa_peak [SECONDS > 0]");
  if (!__builtin_cpu_supports("avx512f")) {
    std::printf("bench_isa_peak: this CPU has no AVX-512; nothing to measure\n");
    return 0;
  }
  const double fma = fma_gflops();
  std::printf("fp32 FMA (vfmadd231ps zmm):          %7.1f GFLOP/s per core\n", fma);
  if (!__builtin_cpu_supports("avx512bf16")) {
    std::printf("bf16 dot product: this CPU has no AVX512-BF16\n");
    return 0;
  }
  const double dp = dpbf16_gflops();
  std::printf("bf16 dot product (vdpbf16ps zmm):    %7.1f GFLOP/s per core, %.2fx the fp32 FMA's\n", dp, dp / fma);
  return 0;
}
