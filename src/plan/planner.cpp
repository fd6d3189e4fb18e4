// Ranking layouts and printing them (see planner.h).
#include "plan/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "core/json.h"

namespace mt::plan {

std::vector<PlanRow> plan_layouts(const Config& base, const PlanOptions& o, Calibration& cal) {
  std::vector<PlanRow> rows;
  for (const Layout& l : enumerate_layouts(base, o.world)) {
    const Config cfg = apply_layout(base, l);
    PlanRow row;
    row.layout = l;
    row.micro_batches = micro_batches(base, l);
    row.memory = predict_memory(cfg, o.world);
    if (o.memory_limit_mb > 0 && row.memory_mb() > o.memory_limit_mb) continue;
    if (o.time) {
      row.time = predict_step(cfg, o.world, cal, o.step);
      row.timed = true;
    }
    rows.push_back(row);
  }
  if (o.time)
    std::stable_sort(rows.begin(), rows.end(), [](const PlanRow& a, const PlanRow& b) {
      // Step times in the same 0.1% bin are a tie: the smaller memory wins. (Bins, not a tolerance, keep the
      // order a strict weak ordering.)
      auto bin = [](double ms) { return std::floor(std::log(std::max(ms, 1e-9)) / std::log(1.001)); };
      const double ba = bin(a.time.step_ms), bb = bin(b.time.step_ms);
      if (ba != bb) return ba < bb;
      return a.memory.peak < b.memory.peak;
    });
  return rows;
}

namespace {
// A shell word: quoted when it holds anything but the characters config keys, values and paths use.
std::string shell_word(const std::string& w) {
  if (!w.empty() && w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.,/=:+-[]") ==
                        std::string::npos)
    return w;
  std::string q = "'";
  for (char c : w) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}
}  // namespace

std::string trainer_command(const Config& base, const Layout& l, const RunContext& rc) {
  std::string cmd = fmt::format("mpirun -np {} build/trainer --config {}", rc.world, shell_word(rc.config));
  for (const std::string& s : rc.sets) cmd += " --set " + shell_word(s);
  for (const std::string& s : layout_overrides(base, l, rc.world)) cmd += " --set " + s;
  return cmd;
}

std::string sweep_command(const Config& base, const Layout& l, const RunContext& rc) {
  std::string cmd = fmt::format("scripts/sweep.py --config {} --np {}", shell_word(rc.config), rc.world);
  for (const std::string& s : rc.sets) cmd += " --set " + shell_word(s);
  std::string point;
  for (const std::string& s : layout_overrides(base, l, rc.world)) point += (point.empty() ? "" : " ") + s;
  return point.empty() ? cmd : cmd + " --point " + shell_word(point);
}

namespace {
std::tuple<int, int, int, int> mesh_of(const Layout& l) { return {l.dp, l.cp, l.tp, l.pp}; }
}  // namespace

std::vector<PlanRow> best_per_mesh(const std::vector<PlanRow>& rows) {
  std::vector<PlanRow> out;
  for (const PlanRow& r : rows)
    if (std::none_of(out.begin(), out.end(), [&](const PlanRow& o) { return mesh_of(o.layout) == mesh_of(r.layout); }))
      out.push_back(r);
  return out;
}

namespace {
std::string layout_cell(const Layout& l) {
  return fmt::format("{}x{}x{} {}{}", l.dp, l.tp, l.pp, name_of(l.schedule),
                     l.schedule == PipelineSchedule::Interleaved ? fmt::format("/v{}", l.virtual_stages) : "");
}
}  // namespace

bool ties_first(const std::vector<PlanRow>& rows, size_t i, double spread) {
  return i < rows.size() && rows[0].timed && rows[i].timed &&
         rows[i].time.step_ms <= rows[0].time.step_ms * (1 + spread);
}

std::string format_table(const std::vector<PlanRow>& rows, int top, const Config& base, const RunContext& rc,
                         size_t hidden, double spread) {
  std::string s = fmt::format("{:>5}  {:<21} {:>3} {:>3} {:>4} {:>4} {:>9} {:>10} {:>9} {:>10} {:>11} {:>9}\n",
                              "rank", "dp x tp x pp schedule", "cp", "mb", "m", "zero", "step_ms", "tokens/s",
                              "memory_mb", "compute_ms", "exposed_ms", "bubble_ms");
  const int n = top > 0 ? std::min<int>(top, int(rows.size())) : int(rows.size());
  for (int i = 0; i < n; ++i) {
    const PlanRow& r = rows[i];
    const Layout& l = r.layout;
    const std::string rank = fmt::format("{}{}", ties_first(rows, size_t(i), spread) && i > 0 ? "=" : "", i + 1);
    if (r.timed)
      s += fmt::format("{:>5}  {:<21} {:>3} {:>3} {:>4} {:>4} {:>9.2f} {:>10.0f} {:>9.2f} {:>10.2f} {:>11.2f} "
                       "{:>9.2f}\n",
                       rank, layout_cell(l), l.cp, l.micro_batch, r.micro_batches, l.zero, r.time.step_ms,
                       r.time.tokens_per_s, r.memory_mb(), r.time.compute_ms, r.time.exposed_comm_ms,
                       r.time.bubble_ms);
    else
      s += fmt::format("{:>5}  {:<21} {:>3} {:>3} {:>4} {:>4} {:>9} {:>10} {:>9.2f} {:>10} {:>11} {:>9}\n", i + 1,
                       layout_cell(l), l.cp, l.micro_batch, r.micro_batches, l.zero, "-", "-", r.memory_mb(), "-", "-",
                       "-");
    s += "      " + trainer_command(base, l, rc) + "\n";
  }
  if (n < int(rows.size())) s += fmt::format("... {} more (--top 0 lists all)\n", rows.size() - n);
  if (hidden) s += fmt::format("(the fastest layout of each mesh; {} more with another schedule, micro-batch or ZeRO "
                               "stage: --every-layout lists them)\n", hidden);
  return s;
}

std::string format_json(const std::vector<PlanRow>& rows, const Config& base, const RunContext& rc, double spread) {
  std::string s = "[";
  std::set<std::tuple<int, int, int, int>> meshes_seen;  // mesh_best: the first row of each mesh, as the table shows
  for (size_t i = 0; i < rows.size(); ++i) {
    const PlanRow& r = rows[i];
    const Layout& l = r.layout;
    const bool mesh_best = meshes_seen.insert(mesh_of(l)).second;
    const StageMemory& w = r.memory.stages[r.memory.worst_stage];
    std::string stages;
    for (const StageMemory& m : r.memory.stages) {
      stages += fmt::format("{}{{\"pp_rank\": {}, \"peak_bytes\": {:.0f}, \"activation_records\": {}",
                            stages.empty() ? "" : ", ", m.pp_rank, m.peak(), m.records);
      if (r.timed && m.pp_rank < int(r.time.ranks.size())) {
        const StepPrediction::RankPasses& q = r.time.ranks[m.pp_rank];
        stages += fmt::format(", \"fwd_us\": {:.1f}, \"bwd_us\": {:.1f}, \"bwd_input_us\": {:.1f}, "
                              "\"bwd_weight_us\": {:.1f}, \"list_end_ms\": {:.4f}",
                              q.fwd, q.bwd, q.bwd_input, q.bwd_weight, q.list_end_ms);
      }
      stages += "}";
    }
    auto num = [](double x) { return std::isfinite(x) ? fmt::format("{:.4f}", x) : std::string("null"); };
    // ZeRO-3 rows only (the other stages gather nothing inside their passes): the busiest rank's unit gathers.
    const std::string gathers =
        l.zero == 3 && r.timed
            ? fmt::format(", \"param_gathers\": {{\"count\": {}, \"bytes\": {:.0f}, \"wait_ms\": {}}}",
                          r.time.param_gathers, r.time.param_gather_bytes, num(r.time.param_gather_wait_ms))
            : "";
    s += fmt::format(
        "{}\n  {{\"rank\": {}, \"dp\": {}, \"cp\": {}, \"tp\": {}, \"pp\": {}, \"schedule\": {}, "
        "\"virtual_stages\": {}, \"micro_batch\": {}, \"zero\": {}, \"micro_batches\": {}, \"step_ms\": {}, "
        "\"tokens_per_s\": {}, \"compute_ms\": {}, \"exposed_comm_ms\": {}, \"bubble_ms\": {}, \"pipeline_ms\": {}, "
        "\"optimizer_ms\": {}, "
        "\"dp_comm_ms\": {}, \"memory_mb\": {:.4f}, \"memory_bytes\": {:.0f}, \"memory\": {{\"pp_rank\": {}, "
        "\"params_bytes\": {:.0f}, \"grads_bytes\": {:.0f}, \"optimizer_bytes\": {:.0f}, \"dp_state_bytes\": {:.0f}, "
        "\"activation_bytes\": {:.0f}, \"activation_records\": {}, \"buffer_bytes\": {:.0f}, "
        "\"scratch_bytes\": {:.0f}, \"small_bytes\": {:.0f}, \"setup_bytes\": {:.0f}}}{}, \"stages\": [{}], "
        "\"ties_first\": {}, \"mesh_best\": {}, \"command\": {}, \"sweep_command\": {}}}",
        i ? "," : "", i + 1, l.dp, l.cp, l.tp, l.pp, json_quote(name_of(l.schedule)), l.virtual_stages, l.micro_batch,
        l.zero, r.micro_batches, r.timed ? num(r.time.step_ms) : "null", r.timed ? num(r.time.tokens_per_s) : "null",
        r.timed ? num(r.time.compute_ms) : "null", r.timed ? num(r.time.exposed_comm_ms) : "null",
        r.timed ? num(r.time.bubble_ms) : "null", r.timed ? num(r.time.pipeline_ms) : "null",
        r.timed ? num(r.time.optimizer_ms) : "null", r.timed ? num(r.time.dp_comm_ms) : "null", r.memory_mb(),
        r.memory.peak, w.pp_rank, w.params, w.grads, w.optimizer, w.dp_state, w.activations, w.records, w.buffers,
        w.scratch, w.small, w.setup, gathers, stages, ties_first(rows, i, spread) ? "true" : "false",
        mesh_best ? "true" : "false", json_quote(trainer_command(base, l, rc)),
        json_quote(sweep_command(base, l, rc)));
  }
  s += rows.empty() ? "]\n" : "\n]\n";
  return s;
}

}  // namespace mt::plan
