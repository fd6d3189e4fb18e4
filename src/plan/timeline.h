// A simulation of one training step's pipeline phase: every pipeline rank runs its schedule's action list
// (parallel/schedule.h) in order, as PipelineRunner does, with each pass taking its measured compute time plus
// its blocking tensor-parallel collectives, each message arriving a transfer time after its send, and the
// cores shared: when the threads that want a core at a moment outnumber the machine's cores, each runs at
// cores / threads of full speed (processor sharing). Wanting a core: a rank's compute threads while it
// computes (plus what its pipeline communication thread, polling, takes from it), one thread while it waits in
// a collective (its communication thread spins through a collective's first millisecond, docs/comm.md); a rank
// waiting for a pipeline message wants none.
#pragma once
#include <vector>

#include "parallel/schedule.h"

namespace mt::plan {

struct PassCost {
  double work_us = 0;  // compute at full speed
  double wall_us = 0;  // blocking collectives inside the pass
};

// A blocking collective inside a pass (tensor parallelism's) as the pass's cost. Its communication thread's CPU
// (`cpu_us` at full speed: copies, sums, the hand-over) runs at the pass's shared speed `rate`, as compute does; the
// emulated link's delay (`link_us`, counted from the moment every rank arrived) already contains that real operation
// (docs/comm.md), so the pass waits only for what the link takes beyond it: max(link_us, cpu_us / rate) in all.
PassCost blocking_collective(double link_us, double cpu_us, double rate);

struct ChunkCost {
  PassCost fwd, bwd, bwd_input, bwd_weight;
};

struct TimelineInput {
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  int p = 1, m = 1, v = 1;
  std::vector<std::vector<ChunkCost>> chunks;  // [pipeline rank][chunk]
  std::vector<double> xfer_us;                 // per virtual-stage boundary s -> s+1 (p*v - 1 of them): one message
  std::vector<double> start_work_us;           // per pipeline rank: compute before its list (zeroing gradients)
  int ranks_per_stage = 1;                     // dp * tp ranks run each pipeline rank's list
  int threads = 1;                             // compute threads per rank
  double cores = 1;                            // cores of the machine
  // Per pipeline rank: the core share its communication thread, polling the step's outstanding receives, takes
  // from the cores while the rank computes (waking every 25-200 us, it preempts compute threads); empty: none.
  std::vector<double> poll_share;
  double slicing = 0;  // shared_rate's cost of taking turns on a core
  // What a rank blocked on a pipeline message waits beyond the message's arrival when, at that moment, the other
  // ranks' compute threads take every core: its compute thread, asleep, is woken behind a running thread's turn.
  // A message that arrives before its receiver asks for it costs nothing here.
  double wake_us = 0;
  // Per pipeline rank, per action of its list: a blocking wait added to that pass beyond its chunk's cost (ZeRO-3's
  // parameter gathers, which differ from pass to pass); empty: none.
  std::vector<std::vector<double>> action_wait_us;
};

struct TimelineRank {
  double list_start = 0;  // after the start work
  double list_end = 0;    // its last action done
  double span_end = 0;    // its last send complete too (the executor waits for them before the step goes on)
  double busy = 0;        // wall time inside passes (as the executor's busy_ms)
  double tp_wait = 0;     // of which in blocking collectives
  double first_forward_end = 0;  // its first forward pass done (ZeRO's parameter all-gather must be done by then)
  std::vector<double> final_start, final_end;  // per chunk: its final gradient pass (dp buckets launch in it)
  // Per chunk: every pass that reports finished gradients (a backward, or zb1's weight pass) as (start, end), in
  // order (ZeRO-2 reduces in each).
  std::vector<std::vector<std::pair<double, double>>> grad_passes;
  // Per action of its list: (start, end) of a pass, (0, 0) for a send or receive (ZeRO-3 gathers in every pass).
  std::vector<std::pair<double, double>> action_spans;
};

// Throws std::runtime_error if the lists deadlock (they never should: tests/test_schedule.cpp).
std::vector<TimelineRank> simulate_timeline(const TimelineInput& in);

// The speed of each computing rank when `busy` ranks of `threads` threads compute at once on `cores` cores, with
// `other` cores' worth of other threads (communication threads polling) competing for them. `slicing` is what
// taking turns costs beyond the share: the extra time per unit of work for each thread beyond one per core
// (measured on the machine: plan/time_sharing.h; 0 = pure processor sharing).
double shared_rate(double busy_ranks, int threads, double cores, double other = 0, double slicing = 0);

}  // namespace mt::plan
