// Record and receive-buffer counts of an action list (see schedule_usage.h).
#include "plan/schedule_usage.h"

#include <algorithm>
#include <map>

namespace mt::plan {

ScheduleUsage schedule_usage(PipelineSchedule schedule, int p, int m, int v, int rank) {
  const std::vector<Action> list = schedule_fn(schedule)(p, m, v, rank);
  ScheduleUsage u;
  u.records.assign(v, 0);
  auto is_recv = [](ActionKind k) { return k == ActionKind::RecvAct || k == ActionKind::RecvGrad; };
  std::map<std::pair<int, int>, size_t> last;  // (chunk, mb) -> index of its last non-receive action
  for (size_t i = 0; i < list.size(); ++i) {
    if (is_recv(list[i].kind)) ++u.recv_actions;
    else last[{list[i].chunk, list[i].micro_batch}] = i;
  }
  std::vector<int> alive(v, 0);
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    if (a.kind == ActionKind::Forward) u.records[a.chunk] = std::max(u.records[a.chunk], ++alive[a.chunk]);
    if (!is_recv(a.kind) && last[{a.chunk, a.micro_batch}] == i) --alive[a.chunk];
  }
  // Evaluation: forward passes of m micro-batches through every chunk; a chunk on stage > 0 receives each.
  for (int c = 0; c < v; ++c)
    if (c * p + rank > 0) u.eval_recvs += m;
  return u;
}

}  // namespace mt::plan
