// comm.adapt under local SGD (train/sync_period_adapt.h) on synthetic measurements, so every decision is
// deterministic: a plant runs steps of a fixed compute time, and the step that ends a period also pays the
// parameter average's cost as exposed communication; the tests check the period the controller picks on fast and
// slow links, that it holds still under noise, and how fast it settles when the link changes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "train/sync_period_adapt.h"

using namespace mt;

namespace {

constexpr double kComputeMs = 100;

// Runs steps [first, last] of a run whose average costs sync_ms(step) (plus noise(step), a fraction of the step),
// syncing as local SGD's due() would; returns the step of the last decision (0: none). A step in `stalled` takes
// stall_ms more: in its exposed communication if it averages (the ranks wait for a stalled one), else in compute.
struct Plant {
  SyncPeriodController& ctl;
  int last_sync = 0;
  int decisions = 0;
  std::vector<int> stalled = {};
  double stall_ms = 0;
  int run(int first, int last, double sync_ms, double noise = 0) {
    int last_decision = 0;
    for (int step = first; step <= last; ++step) {
      const bool synced = step - last_sync >= ctl.period();
      const double wobble = noise * std::sin(step * 2.7);  // deterministic, +-noise
      const double stall = std::count(stalled.begin(), stalled.end(), step) ? stall_ms : 0;
      const double exposed = synced ? sync_ms * (1 + wobble) + stall : 0;
      const double step_ms = (step == 1 ? 5 : 1) * kComputeMs * (1 + wobble) + exposed + (synced ? 0 : stall);
      if (synced) last_sync = step;
      if (ctl.observe(step, step_ms, exposed, synced)) {
        last_decision = step;
        ++decisions;
      }
    }
    return last_decision;
  }
};

}  // namespace

TEST_CASE("comm.adapt local SGD: the shortest period within 2% of the longest's step time") {
  SyncPeriodController ctl({1, 16}, 4);
  // compute 100 ms, average 50 ms: the longest period's step is 103.125 ms, 2% above it 105.19 ms, and 50 / H must
  // be at most 5.19 ms: H >= 9.6.
  CHECK(ctl.shortest_within_slack(kComputeMs, 50) == 10);
  CHECK(ctl.shortest_within_slack(kComputeMs, 2) == 1);     // a fast link: average every step
  CHECK(ctl.shortest_within_slack(kComputeMs, 5000) == 16);  // nothing meets the bound but the longest
  SyncPeriodController narrow({3, 5}, 4);
  CHECK(narrow.shortest_within_slack(kComputeMs, 2) == 3);  // within the user's limits
  CHECK(narrow.shortest_within_slack(kComputeMs, 5000) == 5);
}

// Shortening takes one average; lengthening two (the smaller cost of the last two averages decides it).
TEST_CASE("comm.adapt local SGD: finds the period on fast and slow links within two averages, then stays") {
  struct Case {
    double sync_ms;
    int start, want, decisions;
  };
  // sync 200: 1.02 x (100 + 12.5) = 114.75, so 200 / H <= 14.75: H = 14. Started at 16 it stays: 14 is more than
  // two thirds of 16, and 16 is within 5% (hysteresis).
  for (const Case c : {Case{2, 4, 1, 1}, Case{2, 16, 1, 1}, Case{200, 1, 14, 1}, Case{200, 16, 16, 0},
                       Case{50, 2, 10, 1}}) {
    CAPTURE(c.sync_ms, c.start);
    SyncPeriodController ctl({1, 16}, c.start);
    Plant plant{ctl};
    plant.run(1, 200, c.sync_ms);
    CHECK(ctl.period() == c.want);
    CHECK(plant.decisions == c.decisions);
  }
}

TEST_CASE("comm.adapt local SGD: the run's first step is not counted, and lengthening waits for a second average") {
  // With a period of 1 the first average (step 1) has no counted step, and the second (step 2) alone does not
  // lengthen the period: the decision comes at step 3, on the smaller of the two averages' costs.
  SyncPeriodController ctl({1, 16}, 1);
  CHECK_FALSE(ctl.observe(1, 5 * kComputeMs + 300, 300, true));
  CHECK_FALSE(ctl.observe(2, kComputeMs + 300, 300, true));
  const auto d = ctl.observe(3, kComputeMs + 200, 200, true);
  REQUIRE(d);
  CHECK(d->step == 4);
  CHECK(d->from == 1);
  CHECK(d->to == 14);
  CHECK(d->compute_ms == Approx(kComputeMs));
  CHECK(d->sync_ms == Approx(200));
  CHECK(d->fastest_ms == Approx(kComputeMs + 200.0 / 16));
  CHECK(d->predicted_from_ms == Approx(kComputeMs + 200));
  CHECK(d->predicted_to_ms == Approx(kComputeMs + 200.0 / 14));
}

TEST_CASE("comm.adapt local SGD: one stalled step moves nothing") {
  SECTION("a stalled average on a fast link does not lengthen the period") {
    // An average held up 2 s by something else on the machine asks for the longest period; the next one, at its
    // usual 2 ms, does not confirm it.
    SyncPeriodController ctl({1, 16}, 1);
    Plant plant{ctl, 0, 0, {30}, 2000};
    plant.run(1, 60, 2);
    CHECK(ctl.period() == 1);
    CHECK(plant.decisions == 0);
  }
  SECTION("a stalled step within a period does not shorten it") {
    // 100 ms steps and a 50 ms average: a period of 10. One step 5 s slow would raise the period's mean compute to
    // 600 ms, where an average every 4 steps is within 2%; its median stays at 100 ms.
    SyncPeriodController ctl({1, 16}, 10);
    Plant plant{ctl, 0, 0, {35}, 5000};
    plant.run(1, 100, 50);
    CHECK(ctl.period() == 10);
    CHECK(plant.decisions == 0);
  }
}

TEST_CASE("comm.adapt local SGD: noise of a few percent changes nothing") {
  for (double sync_ms : {2.0, 50.0, 200.0}) {
    CAPTURE(sync_ms);
    SyncPeriodController ctl({1, 16}, 4);
    Plant plant{ctl};
    plant.run(1, 40, sync_ms);
    const int settled = ctl.period(), before = plant.decisions;
    plant.run(41, 400, sync_ms, 0.03);
    CHECK(ctl.period() == settled);
    CHECK(plant.decisions == before);
  }
}

TEST_CASE("comm.adapt local SGD: a link that changes mid-run settles again within 20 steps") {
  SyncPeriodController ctl({1, 16}, 4);
  Plant plant{ctl};
  plant.run(1, 50, 2);  // fast: every step
  REQUIRE(ctl.period() == 1);
  CHECK(plant.run(51, 200, 200) <= 51 + 20);  // slow from step 51
  CHECK(ctl.period() == 14);
  CHECK(plant.run(201, 400, 2) <= 201 + 20);  // fast again: back within one period of 14
  CHECK(ctl.period() == 1);
}
