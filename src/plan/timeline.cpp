// The pipeline phase's event simulation (see timeline.h).
#include "plan/timeline.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <tuple>

#include "parallel/schedule.h"

namespace mt::plan {

double shared_rate(double busy_ranks, int threads, double cores, double other, double slicing) {
  // Every runnable thread gets an equal share of the cores (the kernel's fair scheduler, to first order), less
  // what the turns themselves cost (caches refilled after each switch); a rank's own threads beyond the cores are
  // already in its measured time.
  const double want = busy_ranks * threads + other, have = std::max(cores, double(threads));
  if (want <= have) return 1.0;
  return have / want / (1 + slicing * (want / have - 1));
}

PassCost blocking_collective(double link_us, double cpu_us, double rate) {
  return {cpu_us, std::max(0.0, link_us - cpu_us / rate)};
}

std::vector<TimelineRank> simulate_timeline(const TimelineInput& in) {
  const int p = in.p;
  std::vector<std::vector<Action>> lists(p);
  for (int r = 0; r < p; ++r) lists[r] = schedule_fn(in.schedule)(p, in.m, in.v, r);
  std::vector<TimelineRank> out(p);
  enum Phase { Ready, Cpu, Blocked, Done };  // Cpu: in a pass (or the start work)
  std::vector<Phase> phase(p, Cpu);
  std::vector<size_t> pc(p, 0);
  std::vector<double> left(p, 1), work(p, 0), wall(p, 0), pass_start(p, 0);
  std::vector<double> computing(p, 0);  // wall time of the current pass spent computing (the rest: its waits)
  std::vector<bool> in_pass(p, false);
  std::vector<bool> woken(p, false);  // its awaited message arrived and it was charged its wake-up
  // The index of each chunk's final gradient pass in each list.
  std::vector<std::vector<int>> final_idx(p, std::vector<int>(in.v, -1));
  for (int r = 0; r < p; ++r) {
    out[r].final_start.assign(in.v, 0);
    out[r].final_end.assign(in.v, 0);
    out[r].grad_passes.assign(in.v, {});
    out[r].action_spans.assign(lists[r].size(), {0.0, 0.0});
    for (size_t i = 0; i < lists[r].size(); ++i) {
      const ActionKind k = lists[r][i].kind;
      if (k == ActionKind::Backward || k == ActionKind::BackwardWeight) final_idx[r][lists[r][i].chunk] = int(i);
    }
    work[r] = in.start_work_us.empty() ? 0 : in.start_work_us[r];
  }
  std::map<std::tuple<int, int, int>, double> arrival;  // (grad?, receiving stage, mb) -> time
  double now = 0;
  const double eps = 1e-9;
  auto chunk_cost = [&](int r, const Action& a) -> PassCost {
    const ChunkCost& c = in.chunks[r][a.chunk];
    switch (a.kind) {
      case ActionKind::Forward: return c.fwd;
      case ActionKind::Backward: return c.bwd;
      case ActionKind::BackwardInput: return c.bwd_input;
      default: return c.bwd_weight;
    }
  };
  auto pass_cost = [&](int r, size_t i) {
    PassCost c = chunk_cost(r, lists[r][i]);
    if (!in.action_wait_us.empty()) c.wall_us += in.action_wait_us[r][i];
    return c;
  };
  auto is_pass = [](ActionKind k) {
    return k == ActionKind::Forward || k == ActionKind::Backward || k == ActionKind::BackwardInput ||
           k == ActionKind::BackwardWeight;
  };
  // Whether the compute threads of the ranks other than r take every core now (a rank at the boundary of a pass
  // counts as computing).
  auto cores_taken = [&](int r) {
    double threads = 0;
    for (int o = 0; o < p; ++o) {
      if (o == r) continue;
      const bool computing = (phase[o] == Cpu && work[o] > 0) ||
                             (phase[o] == Ready && pc[o] < lists[o].size() && is_pass(lists[o][pc[o]].kind));
      if (computing) threads += double(in.ranks_per_stage) * in.threads;
    }
    return threads >= in.cores;
  };
  for (;;) {
    // Run every ready rank up to its next pass or wait.
    for (int r = 0; r < p; ++r) {
      while (phase[r] == Ready || phase[r] == Blocked) {
        if (pc[r] >= lists[r].size()) {
          phase[r] = Done;
          out[r].list_end = now;
          out[r].span_end = std::max(out[r].span_end, now);
          break;
        }
        const Action& a = lists[r][pc[r]];
        const int stage = a.chunk * p + r;
        if (a.kind == ActionKind::SendAct || a.kind == ActionKind::SendGrad) {
          const bool grad = a.kind == ActionKind::SendGrad;
          const int boundary = grad ? a.peer_stage : stage;  // between stages `boundary` and `boundary + 1`
          const double t = now + in.xfer_us[boundary];
          arrival[{grad ? 1 : 0, a.peer_stage, a.micro_batch}] = t;
          out[r].span_end = std::max(out[r].span_end, t);
          ++pc[r];
          phase[r] = Ready;
        } else if (a.kind == ActionKind::RecvAct || a.kind == ActionKind::RecvGrad) {
          auto it = arrival.find({a.kind == ActionKind::RecvGrad ? 1 : 0, stage, a.micro_batch});
          if (it != arrival.end() && it->second <= now + eps) {
            if (phase[r] == Blocked && in.wake_us > 0 && !woken[r] && cores_taken(r)) {
              it->second = now + in.wake_us;
              woken[r] = true;
              break;
            }
            woken[r] = false;
            ++pc[r];
            phase[r] = Ready;
          } else {
            phase[r] = Blocked;
            break;
          }
        } else {
          const PassCost c = pass_cost(r, pc[r]);
          pass_start[r] = now;
          in_pass[r] = true;
          left[r] = 1;  // fraction of the pass still to run
          computing[r] = 0;
          work[r] = c.work_us;
          wall[r] = c.wall_us;
          phase[r] = Cpu;
          break;
        }
      }
    }
    if (std::all_of(phase.begin(), phase.end(), [](Phase f) { return f == Done; })) break;
    // A pass is fluid: its compute and its blocking collectives interleave. At speed `rate` a pass of work W
    // and waits L lasts W/rate + L and wants (threads W/rate + L) / (W/rate + L) cores on average (a waiting
    // rank's communication thread spins); the speed is the fixed point of that demand against the cores
    // (monotone from 1 down).
    // The pipeline's communication threads polling their receives: what they take from a rank in a pass.
    double other = 0;
    for (int r = 0; r < p; ++r)
      if (phase[r] == Cpu && !in.poll_share.empty()) other += in.poll_share[r] * in.ranks_per_stage;
    double rate = 1;
    const double spin = 1.0 / in.threads;  // one thread, in units of a rank's compute threads
    for (int it = 0; it < 30; ++it) {
      double demand = 0;
      for (int r = 0; r < p; ++r)
        if (phase[r] == Cpu && work[r] > 0)
          demand += in.ranks_per_stage * (work[r] / rate + spin * wall[r]) / (work[r] / rate + wall[r]);
      const double next = shared_rate(demand, in.threads, in.cores, other, in.slicing);
      if (std::fabs(next - rate) < 1e-9) break;
      rate = next;
    }
    auto length = [&](int r) { return work[r] / rate + wall[r]; };  // the whole pass at this speed
    double dt = std::numeric_limits<double>::infinity();
    for (int r = 0; r < p; ++r) {
      if (phase[r] == Cpu) dt = std::min(dt, left[r] * length(r));
      if (phase[r] == Blocked) {
        const Action& a = lists[r][pc[r]];
        auto it = arrival.find({a.kind == ActionKind::RecvGrad ? 1 : 0, a.chunk * p + r, a.micro_batch});
        if (it != arrival.end()) dt = std::min(dt, std::max(0.0, it->second - now));
      }
    }
    if (!(dt < std::numeric_limits<double>::infinity())) throw std::runtime_error("pipeline timeline: deadlock");
    now += dt;
    for (int r = 0; r < p; ++r) {
      if (phase[r] == Cpu) {
        const double len = length(r);
        if (len > 0) computing[r] += dt * (work[r] / rate) / len;
        left[r] = len > 0 ? left[r] - dt / len : 0;
        if (left[r] <= eps) phase[r] = Ready;
      }
      if (phase[r] != Ready) continue;
      if (!in_pass[r]) {  // the start work is done: the list begins
        out[r].list_start = now;
        continue;
      }
      // A pass is complete.
      const Action& a = lists[r][pc[r]];
      out[r].busy += now - pass_start[r];
      out[r].tp_wait += std::max(0.0, (now - pass_start[r]) - computing[r]);
      if (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardWeight)
        out[r].grad_passes[a.chunk].push_back({pass_start[r], now});
      out[r].action_spans[pc[r]] = {pass_start[r], now};
      if (a.kind == ActionKind::Forward && out[r].first_forward_end == 0) out[r].first_forward_end = now;
      if (final_idx[r][a.chunk] == int(pc[r])) {
        out[r].final_start[a.chunk] = pass_start[r];
        out[r].final_end[a.chunk] = now;
      }
      in_pass[r] = false;
      ++pc[r];
    }
  }
  return out;
}

}  // namespace mt::plan
