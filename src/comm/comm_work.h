// The handle every host backend returns (MPI, shared memory, the emulation wrapper, hierarchical): completed once
// by the backend's thread, waited on by callers. wait() sleeps on a condition variable (no core is taken while a
// peer is late), counts the time it blocked into the communicator's exposed-communication total, and ends the job
// through the watchdog when the operation outlives comm.timeout_s.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/comm_options.h"
#include "comm/communicator.h"

namespace mt {

// What a handle shares with its communicator (a handle may outlive the communicator).
struct WaitStats {
  std::string name;     // the communicator's name, for the watchdog's line
  double timeout_s = 0;  // comm.timeout_s (0 = wait forever)
  int world_rank = 0;
  std::atomic<int64_t> wait_ns{0};  // total time callers blocked in wait()

  double total_wait_us() const { return wait_ns.load(std::memory_order_relaxed) * 1e-3; }
};
// A WaitStats for communicator `name` on this rank (reads the MPI world rank).
std::shared_ptr<WaitStats> make_wait_stats(const std::string& name, double timeout_s);

class CommWork : public Work {
 public:
  CommWork(std::shared_ptr<WaitStats> s, CommKind kind, uint64_t seq) : s_(std::move(s)), kind_(kind), seq_(seq) {}
  void wait() override;
  bool done() const override { return done_.load(std::memory_order_acquire); }
  // Called once, by the thread that finished the operation (its results must be in place).
  void complete();
  CommKind kind() const { return kind_; }

 private:
  std::shared_ptr<WaitStats> s_;
  CommKind kind_;
  uint64_t seq_;
  std::mutex m_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
};

// CPU time (us) a thread has used, by its pthread handle (CLOCK from pthread_getcpuclockid); 0 if unavailable.
double thread_cpu_us(std::thread::native_handle_type thread);

}  // namespace mt
