// Stale-synchronous data parallelism (optim.staleness = S > 0, docs/staleness.md). Each step's gradients are copied
// into a slot of a ring and their average over the dp group starts in the background; the step then applies, in step
// order, the averages that are ready instead of waiting for its own:
//   - every average of a step <= t - S, waiting for it if it is still in flight: a replica at step t has applied
//     everything up to t - S, and since an all-reduce completes only once every replica has issued it, no replica
//     runs more than S steps ahead of the slowest;
//   - with the newest policy also every later one already complete (the staleness then varies from 0 to S);
//     with the fixed policy exactly those, so the staleness is always S and a run repeats bit for bit.
// Every replica applies the same averages in the same order, each exactly once, so their optimizer trajectories
// are identical; only the weights at which each replica computes its gradients differ, by what it has not yet
// applied. finish() applies whatever is still in flight (before an evaluation, a checkpoint and the end).
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "parallel/staleness_policy.h"

namespace mt {

class StaleGradients {
 public:
  // numel: gradient elements (fp32, host); S >= 1.
  StaleGradients(Communicator& dp, int64_t numel, int staleness, StalenessPolicy policy);

  // The average of step `step`'s gradients, ready to apply: `avg` is valid during the call.
  using ApplyFn = std::function<void(int64_t step, const Tensor& avg)>;

  // Copies this step's gradients into a free slot and starts their average over dp. Steps are issued in order.
  void issue(int64_t step, const Tensor& grads);
  // Applies what step `step` must or may (see above); returns how many it applied.
  int apply_ready(int64_t step, const ApplyFn& apply);
  // Applies every average still in flight.
  int finish(const ApplyFn& apply);

  int staleness() const { return S_; }
  int in_flight() const { return int(queue_.size()); }
  int64_t state_bytes() const;  // the ring's slots

 private:
  struct InFlight {
    int64_t step;
    int slot;
    WorkPtr work;
  };
  void apply_front(const ApplyFn& apply);

  Communicator& dp_;
  int S_;
  StalenessPolicy policy_;
  std::vector<Tensor> slots_;  // S + 1: at most S averages wait while the next step's gradients are copied in
  std::vector<int> free_;
  std::deque<InFlight> queue_;
};

}  // namespace mt
