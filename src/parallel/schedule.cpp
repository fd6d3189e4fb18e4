#include "parallel/schedule.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/check.h"
#include "core/errors.h"

namespace mt {
namespace {

// Appends a forward of (mb, chunk) with its receive/send on a pipeline of p ranks, v chunks.
void push_forward(std::vector<Action>& out, int p, int v, int rank, int mb, int chunk) {
  const int stage = chunk * p + rank, last = p * v - 1;
  if (stage > 0) out.push_back({ActionKind::RecvAct, mb, chunk, stage - 1});
  out.push_back({ActionKind::Forward, mb, chunk, -1});
  if (stage < last) out.push_back({ActionKind::SendAct, mb, chunk, stage + 1});
}

void push_backward(std::vector<Action>& out, int p, int v, int rank, int mb, int chunk, ActionKind kind) {
  const int stage = chunk * p + rank, last = p * v - 1;
  if (stage < last) out.push_back({ActionKind::RecvGrad, mb, chunk, stage + 1});
  out.push_back({kind, mb, chunk, -1});
  if (stage > 0) out.push_back({ActionKind::SendGrad, mb, chunk, stage - 1});
}

void check_args(int p, int m, int v, int rank) {
  MT_CHECK(p >= 1 && m >= 1 && v >= 1 && rank >= 0 && rank < p, "bad schedule arguments p={} m={} v={} rank={}", p,
           m, v, rank);
}

}  // namespace

const char* action_kind_name(ActionKind k) {
  switch (k) {
    case ActionKind::Forward: return "F";
    case ActionKind::Backward: return "BW";
    case ActionKind::BackwardInput: return "B";
    case ActionKind::BackwardWeight: return "W";
    case ActionKind::SendAct: return "SendAct";
    case ActionKind::RecvAct: return "RecvAct";
    case ActionKind::SendGrad: return "SendGrad";
    case ActionKind::RecvGrad: return "RecvGrad";
  }
  return "?";
}

std::string to_string(const Action& a) {
  std::string s = fmt::format("{}(mb={},c={}", action_kind_name(a.kind), a.micro_batch, a.chunk);
  if (a.peer_stage >= 0) s += fmt::format(",peer={}", a.peer_stage);
  return s + ")";
}

std::vector<Action> gpipe(int p, int m, int rank) {
  check_args(p, m, 1, rank);
  std::vector<Action> out;
  for (int i = 0; i < m; ++i) push_forward(out, p, 1, rank, i, 0);
  for (int i = 0; i < m; ++i) push_backward(out, p, 1, rank, i, 0, ActionKind::Backward);
  return out;
}

std::vector<Action> one_f_one_b(int p, int m, int rank) {
  check_args(p, m, 1, rank);
  std::vector<Action> out;
  const int warmup = std::min(p - rank - 1, m);
  for (int i = 0; i < warmup; ++i) push_forward(out, p, 1, rank, i, 0);
  for (int i = 0; i < m - warmup; ++i) {
    push_forward(out, p, 1, rank, warmup + i, 0);
    push_backward(out, p, 1, rank, i, 0, ActionKind::Backward);
  }
  for (int i = m - warmup; i < m; ++i) push_backward(out, p, 1, rank, i, 0, ActionKind::Backward);
  return out;
}

std::vector<Action> interleaved(int p, int m, int v, int rank) {
  check_args(p, m, v, rank);
  if (m % p != 0) throw InputError(fmt::format("interleaved schedule needs m ({}) to be a multiple of p ({})", m, p));
  const int total = m * v, group = p * v;
  auto mb_of = [&](int k) { return (k / group) * p + k % p; };
  auto fwd_chunk = [&](int k) { return (k % group) / p; };
  auto bwd_chunk = [&](int k) { return v - 1 - (k % group) / p; };
  const int warmup = m == p ? total : std::min((p - rank - 1) * 2 + (v - 1) * p, total);
  std::vector<Action> out;
  for (int k = 0; k < warmup; ++k) push_forward(out, p, v, rank, mb_of(k), fwd_chunk(k));
  for (int k = 0; k < total - warmup; ++k) {
    push_forward(out, p, v, rank, mb_of(warmup + k), fwd_chunk(warmup + k));
    push_backward(out, p, v, rank, mb_of(k), bwd_chunk(k), ActionKind::Backward);
  }
  for (int k = total - warmup; k < total; ++k)
    push_backward(out, p, v, rank, mb_of(k), bwd_chunk(k), ActionKind::Backward);
  return out;
}

std::vector<Action> zb1(int p, int m, int rank) {
  check_args(p, m, 1, rank);
  // The order comes from a greedy run of all p stages in unit steps (F = B = W = 1): at each step a stage does a
  // B whose gradient has arrived, else an F whose input has arrived while fewer than p - stage activations are
  // alive (F done, B not: 1F1B's count) and fewer than 2p - stage - 1 records are held (F done, W not: 1F1B's
  // p - stage plus at most p - 1 deferred W passes, ZB-H1's memory), else a deferred W. The chosen order is
  // then replayed as this rank's list. (A tighter bound on held records costs bubble: p + 1 already fails for
  // p = 4 in the simulator test.)
  std::vector<int> nf(p, 0), nb(p, 0), nw(p, 0);
  std::vector<std::vector<int>> f_done(p, std::vector<int>(m, -1)), b_done(p, std::vector<int>(m, -1));
  std::vector<std::vector<std::pair<ActionKind, int>>> order(p);
  for (int t = 0; ; ++t) {
    bool all = true;
    std::vector<std::pair<int, int>> did;  // (stage, kind 0 F 1 B 2 W) this step
    for (int s = 0; s < p; ++s) {
      if (nw[s] == m) continue;
      all = false;
      const int mbB = nb[s], mbF = nf[s];
      if (mbB < nf[s] && f_done[s][mbB] >= 0 && f_done[s][mbB] < t &&
          (s == p - 1 || (b_done[s + 1][mbB] >= 0 && b_done[s + 1][mbB] < t))) {
        did.push_back({s, 1});
      } else if (mbF < m && nf[s] - nb[s] < p - s && nf[s] - nw[s] < 2 * p - s - 1 && (s == 0 || (f_done[s - 1][mbF] >= 0 && f_done[s - 1][mbF] < t))) {
        did.push_back({s, 0});
      } else if (nw[s] < nb[s]) {
        did.push_back({s, 2});
      }
    }
    if (all) break;
    MT_CHECK(t < 100 * (m + p), "zb1 schedule generation did not finish");
    for (auto [s, k] : did) {
      if (k == 0) { f_done[s][nf[s]] = t; order[s].push_back({ActionKind::Forward, nf[s]++}); }
      else if (k == 1) { b_done[s][nb[s]] = t; order[s].push_back({ActionKind::BackwardInput, nb[s]++}); }
      else order[s].push_back({ActionKind::BackwardWeight, nw[s]++});
    }
  }
  std::vector<Action> out;
  for (auto [k, mb] : order[rank]) {
    if (k == ActionKind::Forward) push_forward(out, p, 1, rank, mb, 0);
    else if (k == ActionKind::BackwardInput) push_backward(out, p, 1, rank, mb, 0, k);
    else out.push_back({k, mb, 0, -1});
  }
  return out;
}

ScheduleFn schedule_fn(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::GPipe: return [](int p, int m, int, int r) { return gpipe(p, m, r); };
    case PipelineSchedule::OneFOneB: return [](int p, int m, int, int r) { return one_f_one_b(p, m, r); };
    case PipelineSchedule::Interleaved: return [](int p, int m, int v, int r) { return interleaved(p, m, v, r); };
    case PipelineSchedule::ZB1: return [](int p, int m, int, int r) { return zb1(p, m, r); };
  }
  MT_CHECK(false, "unknown pipeline schedule {}", static_cast<int>(schedule));
}

SimResult simulate(const ScheduleFn& schedule, int p, int m, int v, const SimCosts& costs) {
  SimResult res;
  res.ranks.resize(p);
  std::vector<std::vector<Action>> lists(p);
  for (int r = 0; r < p; ++r) lists[r] = schedule(p, m, v, r);
  const int last = p * v - 1;
  auto fail = [&](const std::string& msg) {
    if (res.error.empty()) res.error = msg;
    res.complete = false;
  };
  // Messages sent: (is_grad, from_stage, to_stage, mb) -> time sent; and those received.
  std::map<std::tuple<int, int, int, int>, double> sent;
  std::map<std::tuple<int, int, int, int>, int> received;
  // Per (stage, mb): 0 nothing, 1 forward done, 2 backward(-input) done, 3 weight done (split backward).
  std::vector<std::vector<int>> state(p * v, std::vector<int>(m, 0));
  std::vector<std::vector<bool>> split(p * v, std::vector<bool>(m, false));
  std::vector<size_t> pc(p, 0);
  std::vector<double> clock(p, 0);
  std::vector<int> alive(p, 0), held(p, 0);

  for (;;) {
    bool progress = false, remaining = false;
    for (int r = 0; r < p; ++r) {
      while (pc[r] < lists[r].size()) {
        const Action& a = lists[r][pc[r]];
        if (a.chunk < 0 || a.chunk >= v || a.micro_batch < 0 || a.micro_batch >= m) {
          fail(fmt::format("rank {}: action {} out of range", r, to_string(a)));
          pc[r] = lists[r].size();
          break;
        }
        const int stage = a.chunk * p + r, mb = a.micro_batch;
        auto where = [&] { return fmt::format("rank {} stage {}: {}", r, stage, to_string(a)); };
        int& st = state[stage][mb];
        bool blocked = false;
        double cost = 0;
        switch (a.kind) {
          case ActionKind::SendAct:
          case ActionKind::SendGrad: {
            const bool grad = a.kind == ActionKind::SendGrad;
            if (a.peer_stage != (grad ? stage - 1 : stage + 1) || (grad ? st < 2 : st < 1))
              fail(where() + (grad ? " sends before its backward or to the wrong stage"
                                   : " sends before its forward or to the wrong stage"));
            auto key = std::make_tuple(grad ? 1 : 0, stage, a.peer_stage, mb);
            if (sent.count(key)) fail(where() + " sent twice");
            sent[key] = clock[r];
            break;
          }
          case ActionKind::RecvAct:
          case ActionKind::RecvGrad: {
            const bool grad = a.kind == ActionKind::RecvGrad;
            auto key = std::make_tuple(grad ? 1 : 0, a.peer_stage, stage, mb);
            auto it = sent.find(key);
            if (it == sent.end()) {
              blocked = true;
              break;
            }
            clock[r] = std::max(clock[r], it->second);
            if (++received[key] > 1) fail(where() + " received twice");
            break;
          }
          case ActionKind::Forward:
            if (st != 0) fail(where() + " forward not first / repeated");
            if (stage > 0 && !received.count(std::make_tuple(0, stage - 1, stage, mb)))
              fail(where() + " forward without its input activation received");
            st = 1;
            cost = costs.forward;
            res.ranks[r].peak_alive = std::max(res.ranks[r].peak_alive, ++alive[r]);
            res.ranks[r].peak_held = std::max(res.ranks[r].peak_held, ++held[r]);
            break;
          case ActionKind::Backward:
          case ActionKind::BackwardInput:
            if (st != 1) fail(where() + " backward without forward / repeated");
            if (stage < last && !received.count(std::make_tuple(1, stage + 1, stage, mb)))
              fail(where() + " backward without its output gradient received");
            split[stage][mb] = a.kind == ActionKind::BackwardInput;
            st = a.kind == ActionKind::Backward ? 3 : 2;
            cost = a.kind == ActionKind::Backward ? costs.backward : costs.backward_input;
            --alive[r];
            if (a.kind == ActionKind::Backward) --held[r];
            break;
          case ActionKind::BackwardWeight:
            if (st != 2 || !split[stage][mb]) fail(where() + " weight pass without input pass / repeated");
            st = 3;
            cost = costs.backward_weight;
            --held[r];
            break;
        }
        if (blocked) break;
        clock[r] += cost;
        res.ranks[r].busy += cost;
        ++pc[r];
        progress = true;
      }
      if (pc[r] < lists[r].size()) remaining = true;
    }
    if (!remaining) break;
    if (!progress) {
      res.deadlock = true;
      std::string msg = "deadlock:";
      for (int r = 0; r < p; ++r) {
        res.ranks[r].actions_left = static_cast<int>(lists[r].size() - pc[r]);
        if (pc[r] < lists[r].size()) msg += fmt::format(" rank {} waits at {};", r, to_string(lists[r][pc[r]]));
      }
      fail(msg);
      break;
    }
  }
  for (int s = 0; s <= last; ++s)
    for (int mb = 0; mb < m; ++mb)
      if (state[s][mb] != 3) fail(fmt::format("stage {} micro-batch {} incomplete (state {})", s, mb, state[s][mb]));
  for (auto& kv : sent)
    if (!received.count(kv.first)) fail("a message was sent but never received");
  for (int r = 0; r < p; ++r) {
    res.ranks[r].makespan = clock[r];
    res.makespan = std::max(res.makespan, clock[r]);
  }
  for (int r = 0; r < p; ++r) res.ranks[r].idle = res.makespan - res.ranks[r].busy;
  return res;
}

}  // namespace mt
