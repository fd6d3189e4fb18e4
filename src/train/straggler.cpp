#include "train/straggler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "core/philox.h"

namespace mt {

namespace {

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

double straggler_delay_ms(double mean_ms, double sigma, uint64_t seed, int rank, int64_t step) {
  if (mean_ms <= 0) return 0;
  if (sigma <= 0) return mean_ms;
  // exp(N(mu, sigma^2)) has mean exp(mu + sigma^2 / 2): mu = ln(mean) - sigma^2 / 2.
  static const uint64_t stream = fnv1a64("train.straggler");
  const double z = philox_normal(seed, stream ^ (uint64_t(uint32_t(rank)) << 32), uint64_t(step));
  return mean_ms * std::exp(sigma * z - 0.5 * sigma * sigma);
}

RankStraggler rank_straggler(const StragglerSettings& s, int rank) {
  RankStraggler r;
  r.chosen = s.ranks.empty() || std::find(s.ranks.begin(), s.ranks.end(), rank) != s.ranks.end();
  if (!r.chosen) return r;
  r.slowdown = s.slowdown;
  r.delay_ms = s.delay_ms;
  r.delay_sigma = s.delay_sigma;
  r.chosen = r.slowdown > 1.0 || r.delay_ms > 0;
  return r;
}

void sleep_ms(double ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

void ComputeStretch::begin() {
  if (active()) mark_us_ = now_us();
}

void ComputeStretch::account() {
  if (!active()) return;
  pay(1000.0);
}

void ComputeStretch::settle() {
  if (!active()) return;
  pay(0.0);
  debt_us_ = 0;  // a sleep's overshoot is not credited to the next pass: each pass lasts at least factor x
}

void ComputeStretch::pay(double min_us) {
  const double t = now_us();
  debt_us_ += (factor_ - 1.0) * (t - mark_us_);
  if (debt_us_ > min_us) {
    sleep_ms(debt_us_ / 1000.0);
    const double after = now_us();
    debt_us_ -= after - t;  // what was actually slept (sleeps overshoot)
    mark_us_ = after;
    return;
  }
  mark_us_ = t;
}

}  // namespace mt
