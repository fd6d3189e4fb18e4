// The clock and statistics the planner's measurements share (calibration.cpp, stage_passes.cpp, time_sharing.cpp).
#pragma once
#include <algorithm>
#include <chrono>
#include <vector>

namespace mt::plan {

using Clock = std::chrono::steady_clock;

inline double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// The middle value (the mean of the middle two for an even count); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace mt::plan
