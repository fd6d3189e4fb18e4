// Reproducible stragglers (train.straggler): chosen ranks compute `slowdown` times slower, and/or start each step
// after a seeded random delay. Both are spent sleeping, so an emulated straggler costs no CPU and the other ranks
// on a shared machine keep their cores.
#pragma once
#include <cstdint>
#include <vector>

namespace mt {

struct StragglerSettings {
  std::vector<int> ranks;  // the global ranks slowed down; empty = every rank
  double slowdown = 1.0;   // compute takes this many times as long (>= 1)
  double delay_ms = 0;     // mean of the per-step delay (0 = none)
  double delay_sigma = 0;  // its tail: the sigma of a log-normal with that mean (0 = the same delay every step)
};

// The per-step delay of `rank` at `step`: log-normal with mean `mean_ms` and shape `sigma`, a pure function of
// (seed, rank, step), so a run repeats exactly and each rank draws its own.
double straggler_delay_ms(double mean_ms, double sigma, uint64_t seed, int rank, int64_t step);

// Stretches this rank's compute by a factor: the caller marks points inside its compute (account) and the end of
// each compute pass (settle); the time computed since the last mark, times (factor - 1), is owed and slept off.
// Debts under a millisecond wait for the next mark, since short sleeps overshoot; settle pays everything, so a
// pass of t ms takes at least factor x t ms whatever its marks (more by what the last sleep overshoots).
class ComputeStretch {
 public:
  explicit ComputeStretch(double factor = 1.0) : factor_(factor) {}
  bool active() const { return factor_ > 1.0; }
  void begin();       // the start of a compute pass
  void account();     // a point inside it (e.g. a gradient bucket about to be issued)
  void settle();      // its end

 private:
  void pay(double min_us);
  double factor_;
  double mark_us_ = 0, debt_us_ = 0;
};

// This rank's share of train.straggler.
struct RankStraggler {
  double slowdown = 1.0;
  double delay_ms = 0, delay_sigma = 0;
  bool chosen = false;
};
RankStraggler rank_straggler(const StragglerSettings& s, int rank);

// Sleeps for `ms` (no CPU), when positive.
void sleep_ms(double ms);

}  // namespace mt
