// comm.adapt under local SGD (optim.sync_every >= 1): a controller that chooses the period H, the steps between
// parameter averages, within [comm.adapt_sync_every_min, _max] (docs/adaptive.md). Every rank feeds it the same
// figures (the step's metrics, reduced over the ranks), so every rank decides alike and their averages stay matched.
//
// Model. A period of H steps costs H steps of compute and one average: a mean step of compute + sync / H. A longer
// period is always faster per step and always worse for convergence (the replicas drift further apart), so the
// fastest period is not the goal: the controller picks the shortest period whose mean step is within 2% of the
// fastest the limits allow (the longest), and keeps a period while it stays within 5%: it trades at most 5% of
// step time for the most frequent averaging. Each average is a decision point: compute is the median of the
// period's steps less their exposed communication, and the average's cost is the period's exposed communication
// (the slowest rank's: the others' also holds their wait for it, which no period removes). It moves when the
// current period is more than 5% slower than the longest, or when a period at most two thirds as long is within
// 2% (the gap between the two bounds is the hysteresis against noise). A step stalled by something else on the
// machine makes an average look dear, never cheap, and the harm is in lengthening (fewer averages, replicas
// further apart): so it lengthens only as far as the last two averages' smaller cost asks, and shortens on the
// last one alone. A slower link shows at the second average after the change, a faster one at the first, so it
// settles within two periods of the longest.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace mt {

struct SyncPeriodLimits {
  int min = 1, max = 16;
};

struct SyncPeriodDecision {
  int step = 0;  // the first step of the new period
  int from = 0, to = 0;
  double compute_ms = 0, sync_ms = 0;               // the period's mean compute per step, and its average's cost
  double predicted_from_ms = 0, predicted_to_ms = 0;  // mean step: the current period's, the new one's
  double fastest_ms = 0;                              // mean step at the longest period allowed
};

class SyncPeriodController {
 public:
  // The share of step time a chosen period may cost over the longest's, and the share at which a period is left.
  static constexpr double kSlack = 0.02, kKeep = 0.05;

  SyncPeriodController(const SyncPeriodLimits& limits, int start);

  // Feeds step `step`'s figures (the slowest step over the ranks, the slowest rank's exposed communication);
  // `synced`: the step ended with a parameter average. Returns a decision, to apply from step + 1, when the period
  // should change.
  std::optional<SyncPeriodDecision> observe(int step, double step_ms, double exposed_ms, bool synced);

  int period() const { return period_; }
  // The shortest period in the limits whose mean step (compute + sync / H) is within kSlack of the longest's.
  int shortest_within_slack(double compute_ms, double sync_ms) const;

 private:
  SyncPeriodLimits limits_;
  int period_;
  bool warm_ = false;              // the run's first step (allocation, first touches) is not counted
  std::vector<double> compute_ms_;  // the period's counted steps, less their exposed communication
  double exposed_sum_ = 0;          // over the period's counted steps
  std::optional<double> last_sync_ms_;  // the previous average's cost
};

}  // namespace mt
