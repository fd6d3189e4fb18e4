// Real-time scheduling for the communication threads that never spin (comm.thread_priority, docs/comm.md "Waiting
// without taking a core"). Why: when every core computes, a communication thread woken for a collective waits
// behind the compute threads for its turn, and a collective needs every rank's thread several times (arrival,
// each round's barriers): on 4 ranks sharing 2 cores, gradient buckets started up to 20 ms after their last rank
// had issued them. SCHED_FIFO (priority 1, the lowest real-time one) lets such a wake-up preempt compute at once.
// Only threads that sleep whenever they wait get it: the shared-memory transport's, the network emulation's timer
// and the hierarchical all-reduce's worker. The MPI transport's threads poll or spin inside MPI, and a spinning
// real-time thread would take its core from compute.
#pragma once
#include <string>

namespace mt {

// Whether this process may run threads under SCHED_FIFO priority 1: CAP_SYS_NICE, or an RLIMIT_RTPRIO of at least 1
// (sched(7)), and no cgroup that forbids real-time threads (docs/comm.md says where these come from). Found by
// trying it once on a short-lived thread; on refusal `why` (if given) gets the reason.
bool realtime_threads_permitted(std::string* why = nullptr);

// First thing on a communication thread: SCHED_FIFO priority 1 when `realtime` (the trainer has checked that it is
// permitted; should the OS refuse anyway, the thread keeps its normal priority), else nothing.
void enter_comm_thread(bool realtime);

}  // namespace mt
