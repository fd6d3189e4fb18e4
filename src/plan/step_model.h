// The planner's time model of one training step of a layout, in the phases of the trainer's step (train_step.h):
// the passes (the pipeline schedule simulated, plan/timeline.h, with measured pass times, plan/calibration.h, and
// the network model's collectives, plan/net_model.h), the tied-embedding all-reduce, the data-parallel strategy's
// bucket reductions (train/data_parallel.h), and its update: the loss all-reduce, the optimizer and ZeRO-1/2's
// all-gather (ZeRO-3 gathers the parameters inside the passes instead: plan/param_gathers.h). Formulas:
// docs/planner.md, "Time model".
#pragma once
#include <vector>

#include "plan/calibration.h"
#include "plan/net_model.h"
#include "train/config.h"

namespace mt::plan {

struct StepOptions {
  int threads = 1;   // compute threads per rank (train.threads, else default_compute_threads(world))
  double cores = 1;  // cores of the machine the ranks share (all ranks on one machine, as mpiexec runs them here)
  double slicing = 0;  // what taking turns on a core costs beyond the share (timeline.h's shared_rate)
  double llc_bytes = 0;  // the machine's last-level cache, which its ranks share (0: unknown, no cold extra charged)
  NetOptions net;
};

struct StepPrediction {
  double step_ms = 0, tokens_per_s = 0;
  // As metrics.jsonl defines them: exposed = the most any rank waited on collectives, bubble = the pipeline
  // phase's length minus the least busy stage's time in its passes, compute = step - exposed - bubble.
  double compute_ms = 0, exposed_comm_ms = 0, bubble_ms = 0;
  double pipeline_ms = 0;   // the pipeline phase (the longest rank's list, its sends included)
  double optimizer_ms = 0;  // the slowest rank's optimizer compute (cores shared)
  double dp_comm_ms = 0;    // busiest rank's data-parallel collectives (bucket reductions, ZeRO's all-gathers)
  double core_share = 1;    // the speed of a rank's compute when every rank computes at once (1: a core each)
  // ZeRO-3: the most any pipeline rank's chunks gather per step (unit gathers; their bytes, the all-gathers' output
  // in the compute dtype) and wait for them inside its passes (in exposed_comm_ms); 0 otherwise.
  int param_gathers = 0;
  double param_gather_bytes = 0, param_gather_wait_ms = 0;
  // Per pipeline rank, its chunks' measured pass times per micro-batch at full speed (us), summed over chunks.
  struct RankPasses {
    double fwd = 0, bwd = 0, bwd_input = 0, bwd_weight = 0;
    double list_end_ms = 0;  // when the rank finished its action list in the simulation
  };
  std::vector<RankPasses> ranks;
};

// `cfg` has the layout applied and passes validate(cfg, world).
StepPrediction predict_step(const Config& cfg, int world, Calibration& cal, const StepOptions& o);

}  // namespace mt::plan
