// Timing shared by the C++ benchmarks: the best of repeated batches, robust to a shared, noisy machine.
#pragma once
#include <algorithm>
#include <chrono>
#include <functional>

namespace mt::bench {

// Warm-up call, then batches of calls of ~10 ms each until `seconds` have passed; returns the best batch's
// seconds per call (the batch least disturbed by other processes).
inline double time_best(const std::function<void()>& f, double seconds) {
  using Clock = std::chrono::steady_clock;
  f();
  double best = 1e30, total = 0;
  int per_batch = 1;
  while (total < seconds) {
    auto t0 = Clock::now();
    for (int i = 0; i < per_batch; ++i) f();
    double el = std::chrono::duration<double>(Clock::now() - t0).count();
    total += el;
    best = std::min(best, el / per_batch);
    if (el < 0.01) per_batch *= 2;
  }
  return best;
}

}  // namespace mt::bench
