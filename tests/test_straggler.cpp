// The straggler model (train/straggler.h): seeded delays with the configured mean, the ranks it applies to, and a
// compute stretch that sleeps (no CPU) at least factor x the compute it follows. No upper time bounds: a loaded
// machine only makes the measured compute longer, and the stretch follows the measurement.
#include <catch2/catch.hpp>

#include <time.h>

#include <chrono>
#include <cmath>

#include "train/straggler.h"

using namespace mt;

namespace {
double wall_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
void spin_ms(double ms) {
  const double t0 = wall_ms();
  volatile double x = 0;
  while (wall_ms() - t0 < ms) x = x + 1;
}
}  // namespace

TEST_CASE("straggler: delays are seeded per rank and step, with the configured mean and tail", "[straggler]") {
  CHECK(straggler_delay_ms(0, 1.0, 1, 0, 5) == 0);
  CHECK(straggler_delay_ms(7, 0, 1, 0, 5) == 7);  // no tail: the same delay every step
  CHECK(straggler_delay_ms(7, 1.0, 1, 2, 5) == straggler_delay_ms(7, 1.0, 1, 2, 5));
  CHECK(straggler_delay_ms(7, 1.0, 1, 2, 5) != straggler_delay_ms(7, 1.0, 1, 3, 5));
  CHECK(straggler_delay_ms(7, 1.0, 1, 2, 5) != straggler_delay_ms(7, 1.0, 2, 2, 5));
  for (double sigma : {0.25, 1.0}) {
    const int n = 200000;
    double sum = 0, max = 0;
    for (int s = 0; s < n; ++s) {
      const double d = straggler_delay_ms(10, sigma, 42, 1, s);
      REQUIRE(d > 0);
      sum += d;
      max = std::max(max, d);
    }
    // The sample mean of a log-normal with sigma 1 has a relative standard error of sqrt(e - 1) / sqrt(n) = 0.3%.
    CHECK(std::abs(sum / n - 10) < 0.1);
    CHECK(max > 10 * std::exp(3 * sigma - 0.5 * sigma * sigma));  // a tail: beyond 3 sigma in 200000 draws
  }
}

TEST_CASE("straggler: the settings apply to the chosen ranks, or to every rank when none is named", "[straggler]") {
  StragglerSettings s;
  s.slowdown = 2;
  s.ranks = {1, 3};
  CHECK(rank_straggler(s, 1).chosen);
  CHECK(rank_straggler(s, 1).slowdown == 2);
  CHECK_FALSE(rank_straggler(s, 2).chosen);
  CHECK(rank_straggler(s, 2).slowdown == 1);
  s.ranks.clear();
  CHECK(rank_straggler(s, 2).chosen);
  s.slowdown = 1;  // nothing to emulate
  CHECK_FALSE(rank_straggler(s, 2).chosen);
}

TEST_CASE("straggler: a stretched pass lasts at least factor x its compute, the extra slept", "[straggler]") {
  ComputeStretch stretch(3.0);
  const double w0 = wall_ms(), c0 = thread_cpu_ms();
  stretch.begin();
  double compute = 0;
  for (int part = 0; part < 4; ++part) {  // marks inside the pass, as gradient buckets make them
    const double p0 = wall_ms();
    spin_ms(5);
    compute += wall_ms() - p0;
    stretch.account();
  }
  const double before_settle = wall_ms();
  stretch.settle();
  const double total = wall_ms() - w0, cpu = thread_cpu_ms() - c0;
  CHECK(total >= 3.0 * compute * 0.999);
  // The sleeping took no CPU: what the thread used is the spinning (at most its wall time) plus a little.
  CHECK(cpu < compute + 0.5 * (total - compute));
  CHECK(before_settle - w0 >= compute);
  ComputeStretch off;
  CHECK_FALSE(off.active());
}
