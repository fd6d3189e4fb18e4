// Fault-injection hooks for the whole-program tests, set through the environment only (never by a config):
//   MESHTRAIN_INJECT=grad-inf@STEP   an inf in one gradient of the last rank at that step, as an fp16 overflow in
//                                    its backward pass would leave it (the loss scaler must skip it everywhere)
//   MESHTRAIN_INJECT=loss-nan@STEP   a NaN in one rank's share of that step's loss (the run stops, or with
//                                    train.skip_nonfinite skips the step)
//   MESHTRAIN_INJECT=late-gather@1   ZeRO's parameter all-gathers issued bucket by bucket only when a pass asks
//                                    for them (ParamGather::set_on_demand, ShardedParams::set_on_demand): a
//                                    parameter read before its wait then sees last step's value (ZeRO-3: whatever
//                                    its slot held) on every run, not only on a slow link
//   MESHTRAIN_INJECT=drift@STEP      the last rank nudges one weight of the copy its passes read by one ulp, after
//                                    that step's update and ZeRO-1/2 gathers (no ZeRO-3): the tied wte's first
//                                    element where it holds a copy, else the first parameter tp replicates. The
//                                    copies check must find it where it compares that copy (all but ZeRO-0's
//                                    16-bit copy, whose fp32 masters it compares)
//   MESHTRAIN_FAULT=kill@STEP | stop@STEP   SIGKILL / SIGSTOP to the last rank in the middle of that step
//   MESHTRAIN_FAULT=skip@STEP | size@STEP | reduce@STEP   the last rank skips that step's loss all-reduce over the
//                                    world, reduces two elements there instead of one, or reduces with max instead of
//                                    sum (a desync, for the flight recorder; reduce keeps every message's size, which
//                                    MPI needs to stay out of undefined behaviour: docs/flight_recorder.md)
//   MESHTRAIN_FAULT=check@STEP       the last rank fails a CHECK in the middle of that step
//   MESHTRAIN_CRASH_IN_CHECKPOINT=STEP  (checkpoint.cpp) the last rank dies while writing that step's checkpoint
#pragma once
#include "model/pipeline_chunks.h"

namespace mt {

struct TestHooks {
  int grad_inf_step = -1, loss_nan_step = -1, drift_step = -1, kill_step = -1, stop_step = -1, late_gather_step = -1;
  int skip_step = -1, size_step = -1, reduce_step = -1, check_step = -1;
  static TestHooks from_env();  // logs a warning for every hook that is set
};

// An inf in one gradient element of a tensor-parallel shard (any parameter without tensor parallelism): its
// reductions over dp, and the gradient norm's over tp and pp, carry it to every rank; backward passes accumulate
// into it, so it survives the step.
void inject_grad_inf(const PipelineChunks& model);

// One ulp added to one weight of this rank's copy (MESHTRAIN_INJECT=drift, above).
void inject_weight_drift(const PipelineChunks& model);

// SIGKILL or SIGSTOP to this process, or a failed CHECK, when the hooks say so for `step`.
void maybe_fault(const TestHooks& h, int step);

}  // namespace mt
