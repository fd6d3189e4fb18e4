// run.stop_signals: a signal asks the run to stop at the next step boundary with a checkpoint, as a scheduler's
// preemption needs (Slurm sends SIGTERM before it kills a job, or a signal chosen with --signal). The handler only
// records the signal; the step loop asks stop_requested() at each step's end, every rank agrees through one small
// all-reduce, and the run writes a checkpoint and exits 0. The same signal again ends the process at once.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace mt {

// "TERM, USR1" -> {SIGTERM, SIGUSR1}; names with or without "SIG", any case; "" -> none. False (and `bad` set to
// the offending name) for a name outside TERM, INT, HUP, USR1, USR2.
bool parse_stop_signals(const std::string& list, std::vector<int>& out, std::string& bad);
// "SIGTERM".
std::string signal_name(int sig);

// Installs the handler for `signals` (process-wide, before any thread that should inherit it is created).
void install_stop_signals(const std::vector<int>& signals);
// The first stop signal this process received, or 0; and the seconds since it arrived (0 without one).
int stop_signal_received();
double seconds_since_stop_signal();
// Under local SGD the stop vote is read this many steps late (at most optim.sync_every): a replica may then run
// that far ahead of the slowest between averages before it waits for the vote, and a signal stops the run within
// that many steps, not at the next average, which DiLoCo-scale periods put hundreds of steps away.
constexpr int kLocalSgdVoteLag = 8;

// The steps by which the stop vote is read late: optim.staleness's S (the vote never holds a replica back more than
// the stale reduction does), min(optim.sync_every, kLocalSgdVoteLag) under local SGD, 0 for replicas in lockstep.
inline int stop_vote_lag(int sync_every, int staleness) {
  return sync_every > 0 ? std::min(sync_every, kLocalSgdVoteLag) : staleness;
}

// The ranks' agreement on a stop signal, one vote per step. Collective over `world` (null: this process alone):
// cast() sends this rank's signal (0 = none) for `step` and returns the signal any rank had sent `lag` steps
// earlier (the largest number when they differ), 0 before that. lag 0 waits for this step's vote; optim.staleness
// S uses lag S, so the vote never holds a replica back more than the stale reduction already does.
class StopVote {
 public:
  StopVote(Communicator* world, int lag);
  ~StopVote();
  int cast();

 private:
  Communicator* world_;
  int lag_;
  std::vector<Tensor> votes_;  // a ring of lag + 1 one-element tensors in flight
  std::vector<WorkPtr> work_;
  int64_t cast_ = 0;
};

}  // namespace mt
