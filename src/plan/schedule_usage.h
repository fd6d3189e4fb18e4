// What one pipeline rank's action list (parallel/schedule.h) makes the executor hold, read off the list alone:
// the executor runs it in order, so these counts do not depend on timing.
#pragma once
#include <vector>

#include "parallel/schedule.h"

namespace mt::plan {

struct ScheduleUsage {
  // Per chunk: the most activation records alive at once. A record is taken by a micro-batch's Forward and goes
  // back after that (chunk, micro-batch)'s last non-receive action (PipelineRunner::make_plan), and each chunk
  // has its own pool, so the executor allocates exactly these.
  std::vector<int> records;
  int recv_actions = 0;  // receive buffers of the training list (one per RecvAct / RecvGrad)
  int eval_recvs = 0;    // receive buffers of the evaluation list (PipelineRunner::forward_only over m)
};

// Usage of pipeline rank `rank` of p ranks with v chunks, m micro-batches, under `schedule`.
ScheduleUsage schedule_usage(PipelineSchedule schedule, int p, int m, int v, int rank);

}  // namespace mt::plan
