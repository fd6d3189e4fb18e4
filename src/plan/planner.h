// The planner: every valid layout of a config on N ranks (plan/layout.h), each with its predicted per-rank peak
// memory (plan/memory_model.h) and step time (plan/step_model.h), ranked fastest first; and the table and JSON
// that build/planner prints.
#pragma once
#include <string>
#include <vector>

#include "plan/calibration.h"
#include "plan/layout.h"
#include "plan/memory_model.h"
#include "plan/step_model.h"

namespace mt::plan {

struct PlanRow {
  Layout layout;
  int micro_batches = 0;  // per step per dp rank
  MemoryPrediction memory;
  StepPrediction time;
  bool timed = false;     // false when the time model was skipped (PlanOptions::time = false)
  double memory_mb() const { return memory.peak / 1048576.0; }
};

struct PlanOptions {
  int world = 1;
  double memory_limit_mb = 0;  // > 0: leave out layouts whose predicted peak exceeds it
  bool time = true;            // false: memory only (no calibration); rows then keep the enumeration's order
  StepOptions step;
};

// Ranks by predicted step time, then memory; layouts over the memory limit are left out.
std::vector<PlanRow> plan_layouts(const Config& base, const PlanOptions& o, Calibration& cal);

// What a row's commands are made of: the planner's own --config and --set (the config they load is `base`).
struct RunContext {
  std::string config;
  int world = 1;
  std::vector<std::string> sets;
};
// The trainer command that runs a layout ("mpirun -np N build/trainer --config FILE --set ..."), and the
// scripts/sweep.py command that runs it as a sweep point: the planner's --set flags, then the layout's overrides.
std::string trainer_command(const Config& base, const Layout& l, const RunContext& rc);
std::string sweep_command(const Config& base, const Layout& l, const RunContext& rc);

// The fastest row of each mesh (dp, cp, tp, pp), in rank order: what differs within a mesh (schedule, micro-batch,
// ZeRO) is the finer choice.
std::vector<PlanRow> best_per_mesh(const std::vector<PlanRow>& rows);

// Whether a row's predicted step is within `spread` (relative) of the first row's: the two tie, since runs of one
// layout differ by that much.
bool ties_first(const std::vector<PlanRow>& rows, size_t i, double spread);
// The readable table: the first `top` rows (0 = all) with layout, step_ms, tokens/s, memory_mb and the breakdown,
// each followed by its trainer command, and '=' by the rank of each row that ties the first; `hidden`: rows left
// out before (best_per_mesh), said in the last line.
std::string format_table(const std::vector<PlanRow>& rows, int top, const Config& base, const RunContext& rc,
                         size_t hidden = 0, double spread = 0.10);
// A JSON list of objects, one per row, in rank order, each with its trainer and sweep commands, ties_first and
// mesh_best (the first row of its dp x cp x tp x pp mesh: the rows the table shows by default).
std::string format_json(const std::vector<PlanRow>& rows, const Config& base, const RunContext& rc,
                        double spread = 0.10);

}  // namespace mt::plan
