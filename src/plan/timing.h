// The clock and statistics the planner's measurements share (calibration.cpp, stage_passes.cpp, time_sharing.cpp).
#pragma once
#include <chrono>

#include "core/median.h"  // median()

namespace mt::plan {

using Clock = std::chrono::steady_clock;

inline double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

}  // namespace mt::plan
