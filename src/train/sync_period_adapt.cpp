#include "train/sync_period_adapt.h"

#include <algorithm>
#include <utility>

#include "core/median.h"

namespace mt {

SyncPeriodController::SyncPeriodController(const SyncPeriodLimits& limits, int start)
    : limits_(limits), period_(start) {}

int SyncPeriodController::shortest_within_slack(double compute_ms, double sync_ms) const {
  const double bound = (1 + kSlack) * (compute_ms + sync_ms / limits_.max);
  for (int h = limits_.min; h < limits_.max; ++h)
    if (compute_ms + sync_ms / h <= bound) return h;
  return limits_.max;
}

std::optional<SyncPeriodDecision> SyncPeriodController::observe(int step, double step_ms, double exposed_ms,
                                                                bool synced) {
  if (warm_) {
    compute_ms_.push_back(std::max(0.0, step_ms - exposed_ms));
    exposed_sum_ += exposed_ms;
  }
  warm_ = true;
  if (!synced || compute_ms_.empty()) return std::nullopt;
  SyncPeriodDecision d;
  d.step = step + 1;
  d.from = period_;
  d.compute_ms = median(compute_ms_);
  d.sync_ms = exposed_sum_;
  const std::optional<double> previous = std::exchange(last_sync_ms_, d.sync_ms);
  compute_ms_.clear();
  exposed_sum_ = 0;
  int target = shortest_within_slack(d.compute_ms, d.sync_ms);
  if (target > period_) {
    if (!previous) return std::nullopt;  // one average cannot tell a slower link from a stalled step
    d.sync_ms = std::min(d.sync_ms, *previous);
    target = shortest_within_slack(d.compute_ms, d.sync_ms);
    if (target <= period_) return std::nullopt;  // nor shortens on the smaller cost
  }
  auto mean_step = [&](int h) { return d.compute_ms + d.sync_ms / h; };
  d.fastest_ms = mean_step(limits_.max);
  d.predicted_from_ms = mean_step(period_);
  d.to = target;
  d.predicted_to_ms = mean_step(target);
  const bool too_slow = d.predicted_from_ms > (1 + kKeep) * d.fastest_ms;
  const bool too_long = 3 * target <= 2 * period_;
  if (target == period_ || (!too_slow && !too_long)) return std::nullopt;
  period_ = target;
  return d;
}

}  // namespace mt
