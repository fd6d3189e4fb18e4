// The communication timeline of one rank: every completed operation's [start, end) from the communicators'
// event sinks (called on their communication threads), so the step loop can report comm_ms, the time at least
// one collective was in flight during a step (overlapping operations counted once), and comm_bytes.
#pragma once
#include <cstdint>
#include <mutex>
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

 private:
  std::mutex mu_;
  std::vector<CommEvent> events_;
  int64_t bytes_ = 0;
};

}  // namespace mt
