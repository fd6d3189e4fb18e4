// run.profile: a Chrome trace (chrome://tracing, Perfetto) of every rank: compute spans (forward, backward,
// optimizer), each collective from the communicators' event sinks, and the spans where compute waited on
// communication. pid = global rank; tid 0 = compute, tid 1 = waits, tid 2.. = one row per communicator, and
// tid 1000.. = one row per communicator ("comm <name> thread") with a "running" slice (cat "comm_thread") for each
// span its communication thread ran (was not asleep) on an operation's behalf (CommEvent::thread_run_us).
// Events are kept in memory and gathered to rank 0 at the end, which writes run.dir/trace.json.
#pragma once
#include <mpi.h>

#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace mt {

class Profiler {
 public:
  explicit Profiler(bool enabled) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }
  // A compute span [start_us, end_us) on trace_clock_us().
  void compute(const std::string& name, double start_us, double end_us) { add(name, "compute", 0, start_us, end_us); }
  // Compute blocked on communication.
  void wait(const std::string& name, double start_us, double end_us) { add(name, "wait", 1, start_us, end_us); }
  // A completed collective (thread-safe: called from communication threads).
  void comm(const CommEvent& e);
  // Gathers every rank's events to rank 0 of `world`, which writes them to `path`. Collective over `world`.
  void write(const std::string& path, MPI_Comm world) const;

 private:
  static constexpr int kThreadRow0 = 1000;  // tid of the first communication-thread row
  void add(const std::string& name, const char* cat, int tid, double start_us, double end_us);
  bool enabled_;
  mutable std::mutex mu_;
  std::vector<std::string> comm_names_;  // rows per communicator name
  std::string events_;                   // comma-separated JSON objects, pid filled in at write()
};

}  // namespace mt
