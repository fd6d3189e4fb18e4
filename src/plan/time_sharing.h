// What taking turns on the cores costs beyond each thread's share. When a layout's ranks outnumber the cores, the
// kernel gives each runnable thread its turn, and every turn begins with caches that the others have refilled. How
// much that costs depends on the machine (its caches, a hypervisor's scheduling) and it is the planner's largest
// error on two cores (docs/planner.md, "Taking turns on the cores"), so it is measured, not fitted: several
// processes run the same passes at once, as mpiexec starts a layout's ranks, against as many as fill the cores.
#pragma once
#include <string>
#include <vector>

#include "plan/calibration.h"

namespace mt::plan {

struct TimeSharing {
  int full_copies = 1;   // the baseline's copies: as many as the calibration times the passes with (itself and its
                         // neighbours), each with cores of its own
  double full_us = 0;    // one forward and backward pass while full_copies processes run them (the median of its
                         // rounds' means)
  double shared_us = 0;  // the same while `copies` processes run them at once (the median of its rounds' means)
  double share = 1;      // the share of the cores each copy's threads get: cores / (copies x threads), at most 1
  double ratio = 1;      // shared time x share / full time: the median over the shared rounds, each against the
                         // rounds that fill the cores before and after it
  // shared_rate's term (timeline.h): the extra time per unit of work for each thread beyond one per core,
  // (ratio - 1) / (1 / share - 1), and 0 where taking turns cost nothing or the threads fit the cores.
  double slicing = 0;
};

// How long each child runs its passes per round. 1 s: over six calibrations on 4 ranks, rounds of 0.25 s measured
// the slicing at 0.077-0.167 (mean 0.123), rounds of 1 s over eight at 0.065-0.108 (mean 0.087); 2 s did no better
// (docs/planner.md, "Taking turns on the cores: measured").
constexpr double kTimeSharingRoundSeconds = 1.0;

// The probe's child process: builds the stage, runs one forward and backward pass, prints "ready", waits for a line
// on stdin, then runs passes for `seconds` and prints "<passes> <us>": the forward and backward passes completed
// and the time they took. Returns its exit status.
int time_sharing_child(const ModelConfig& model, const StageShape& shape, int threads, double seconds);

// Starts `command` (argv of a program that runs time_sharing_child) `baseline_copies` times at once (the
// calibration's rank and its neighbours: plan/neighbours.h), then `copies` times at once, then the baseline again,
// five times over (11 rounds), each round's children released at the same moment once all are ready.
// Throws std::runtime_error when a child fails.
TimeSharing measure_time_sharing(const std::vector<std::string>& command, int copies, int baseline_copies,
                                 int threads, double cores);

}  // namespace mt::plan
