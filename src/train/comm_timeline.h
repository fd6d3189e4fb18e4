// The communication timeline of one rank: every completed operation's [start, end) from the communicators'
// event sinks (called on their communication threads), so the step loop can report comm_ms, the time at least
// one collective was in flight during a step (overlapping operations counted once), and comm_bytes.
#pragma once
#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"

namespace mt {

class CommTimeline {
 public:
  // Records one completed operation (thread-safe: communicators' event sinks call it).
  void record(const CommEvent& e);
  // Milliseconds within [begin_us, end_us) covered by at least one operation; forgets operations that ended
  // before end_us.
  double busy_ms(double begin_us, double end_us);
  // Payload bytes of the operations recorded since the last call (this rank's contribution, all communicators).
  int64_t take_bytes();
  // The data-parallel gradient reductions (the "dp" communicator's all-reduces and all-gathers, and with
  // set_world_is_dp the world's all-reduces, whose few bytes pin down the per-operation cost) recorded since the
  // last call: how many, and the sums comm.adapt fits its link to (bytes in MiB, times in us).
  struct LinkSums {
    double ops = 0, mib = 0, us = 0, mib2 = 0, mib_us = 0;
  };
  LinkSums take_link_sums();
  void set_world_is_dp(bool yes) { world_is_dp_ = yes; }
  // The next all-reduce of `bytes` on communicator `comm` to complete is not a step's traffic but the step
  // metrics' own reduction, running in the background while the next steps go on (replicas not in lockstep):
  // left out of comm_ms, comm_bytes and the link sums, as the blocking one is by completing between steps.
  // Call it before issuing that operation.
  void leave_out_next_all_reduce(const std::string& comm, int64_t bytes);

 private:
  std::mutex mu_;
  std::deque<std::pair<std::string, int64_t>> left_out_;  // in issue order: one communicator completes in order
  std::vector<CommEvent> events_;
  int64_t bytes_ = 0;
  LinkSums link_;
  std::atomic<bool> world_is_dp_{false};
};

}  // namespace mt
