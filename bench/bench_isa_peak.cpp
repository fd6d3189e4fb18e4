// bench_isa_peak: one core's peak rate of the instructions a CPU matmul can be built on: the fp32 FMA
// (vfmadd231ps ymm and zmm, 16 and 32 flops) and, where the CPU has AVX512-BF16, the bf16 dot product
// (vdpbf16ps zmm, 64 flops with fp32 accumulation). Their ratio bounds what a bf16 GEMM without AMX can gain over
// fp32, and it is why train.cpu_matmul=auto keeps bf16 on fp32 widening on Intel CPUs without AMX
// (kernels/cpu/matmul_backend.cpp). 24 independent accumulators hide the latency of each instruction, so the loops
// measure throughput. Each loop is compiled for its own instruction set, so this builds and runs on any x86-64 CPU.
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

// The accumulators live here between batches, and their sum is stored where the compiler cannot drop it, so the
// loops that produced them stay.
alignas(64) float g_acc[kChains][16];
volatile float g_sink;

// Runs batches of 2^20 iterations (kChains instructions each, a few ms) for g_seconds; returns the best batch's
// seconds per iteration (the one least disturbed by other processes). Each batch is one call of a function
// compiled for its instruction set (a lambda would not inherit the target and could not inline the intrinsics on
// a machine built without it).
double best_per_iter(void (*batch)(long)) {
  const long n = 1L << 20;
  double best = 1e30, total = 0;
  for (auto& a : g_acc) std::fill(a, a + 16, 0.0f);
  while (total < g_seconds) {
    const auto t0 = Clock::now();
    batch(n);
    const double el = std::chrono::duration<double>(Clock::now() - t0).count();
    total += el, best = std::min(best, el / n);
  }
  for (const auto& a : g_acc) g_sink = g_sink + a[0];
  return best;
}

// Each step adds a tiny product to every accumulator: the sums stay small and normal, so no lane slows on a denormal.
#define MT_ISA_LOOP(LOAD, STORE, STEP)                                              \
  for (int k = 0; k < kChains; ++k) acc[k] = LOAD(g_acc[k]);                       \
  for (long i = 0; i < n; ++i)                                                     \
    _Pragma("GCC unroll 24") for (int k = 0; k < kChains; ++k) acc[k] = STEP;      \
  for (int k = 0; k < kChains; ++k) STORE(g_acc[k], acc[k]);

__attribute__((target("avx2,fma"))) void fma256_batch(long n) {
  __m256 acc[kChains];
  const __m256 x = _mm256_set1_ps(1.0f), y = _mm256_set1_ps(1e-9f);
  MT_ISA_LOOP(_mm256_load_ps, _mm256_store_ps, _mm256_fmadd_ps(x, y, acc[k]))
}

__attribute__((target("avx512f"))) void fma512_batch(long n) {
  __m512 acc[kChains];
  const __m512 x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(1e-9f);
  MT_ISA_LOOP(_mm512_load_ps, _mm512_store_ps, _mm512_fmadd_ps(x, y, acc[k]))
}

__attribute__((target("avx512f,avx512bf16"))) void dpbf16_batch(long n) {
  __m512 acc[kChains];
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3000);  // 1, 2^-31
  MT_ISA_LOOP(_mm512_load_ps, _mm512_store_ps, _mm512_dpbf16_ps(acc[k], x, y))
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2 || (argc == 2 && !mt::bench::arg_number(argv[1], 1e-3, 3600, &g_seconds)))
    mt::bench::usage_exit("bench_isa_peak", "bad arguments", "bench_isa_peak [SECONDS > 0]");
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::printf("bench_isa_peak: this CPU has no AVX2 FMA; nothing to measure\n");
    return 0;
  }
  const double fma256 = kChains * 16 / best_per_iter(fma256_batch) * 1e-9;
  std::printf("fp32 FMA (vfmadd231ps ymm):          %7.1f GFLOP/s per core\n", fma256);
  if (!__builtin_cpu_supports("avx512f")) {
    std::printf("AVX-512: this CPU has none\n");
    return 0;
  }
  const double fma = kChains * 32 / best_per_iter(fma512_batch) * 1e-9;
  std::printf("fp32 FMA (vfmadd231ps zmm):          %7.1f GFLOP/s per core\n", fma);
  if (!__builtin_cpu_supports("avx512bf16")) {
    std::printf("bf16 dot product: this CPU has no AVX512-BF16\n");
    return 0;
  }
  const double dp = kChains * 64 / best_per_iter(dpbf16_batch) * 1e-9;
  std::printf("bf16 dot product (vdpbf16ps zmm):    %7.1f GFLOP/s per core, %.2fx the fp32 FMA's\n", dp, dp / fma);
  return 0;
}
