// The calibration's neighbours (`build/planner --neighbours K|auto`): other processes that keep the rest of the
// cores busy with the same passes while the planner times a shape, as a layout's other ranks do. A pass whose
// weights and gradients stream through the shared cache and memory runs slower beside them than alone: on a 2-core
// AMD EPYC (Zen 5) the whole model's backward at micro-batch 1 took 19-37% longer with a second process computing
// on the other core, at micro-batch 8 about 5%. Whether the planner predicts better with them is not settled (that
// VM's speed drifted more between calibrations than the effect; docs/planner_log.md, "Neighbours"), so the default
// times alone.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "plan/calibration.h"

namespace mt::plan {

class ChildProcess;

// How many neighbours a rank of a layout has (--neighbours auto): the other ranks that compute on cores of their
// own at the same time, min(world, cores / threads) - 1, at least 0.
int neighbour_count(int world, int threads, double cores);

// The neighbour's child process: reads shape lines (shape_line) on stdin; for each builds the stage, runs one
// forward and backward pass, prints "ready" and runs the passes over and over until the next line; ends at the end
// of stdin. Returns its exit status.
int neighbour_child(const ModelConfig& model, int threads);

class Neighbours {
 public:
  // `command`: argv of a program that runs neighbour_child. Nothing starts before the first run(), which says so
  // on stderr when `verbose`.
  Neighbours(std::vector<std::string> command, int count, const StageShape& first, bool verbose);
  ~Neighbours();
  Neighbours(const Neighbours&) = delete;
  Neighbours& operator=(const Neighbours&) = delete;

  // Each neighbour runs `s`'s passes (nullptr: those it runs already, or the first shape) once this returns. A
  // neighbour that fails ends them all with a warning on stderr: the timings go on alone.
  void run(const StageShape* s);

 private:
  void stop();
  std::vector<std::string> command_;
  int count_;
  StageShape first_, running_;
  bool verbose_, started_ = false, failed_ = false;
  std::vector<std::unique_ptr<ChildProcess>> children_;
  void (*old_sigpipe_)(int) = nullptr;
};

}  // namespace mt::plan
