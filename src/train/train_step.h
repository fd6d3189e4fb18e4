// One optimizer step of a built run, and the evaluation pass. Per step: the data-parallel strategy's begin_step
// (data_parallel.h: zero the gradients); this rank's pipeline schedule over its model chunks (with pp = 1: forward
// and backward per micro-batch), each micro-batch's forward scaling the loss's gradient by 1 / tokens on this dp
// rank, backward passes accumulating, and the strategy's hooks starting the finished gradient buckets' reduction
// during the last (ZeRO-2: every) gradient pass; the tied embedding's gradient summed between the first and last
// stage; then the strategy's update: wait for the buckets, clip and step the optimizer (optimizer_update below;
// under ZeRO on this rank's shards, then the all-gather in the background), local SGD's parameter average when
// due, or stale's averages that are ready. Activation records and scratch are sized by the first step, so
// steady-state steps allocate nothing.
#pragma once
#include <string>

#include "train/training_run.h"

namespace mt {

struct StepResult {
  // Mean token loss over the whole global batch, the same on every rank; local SGD: over this replica's share,
  // the same on each of its ranks (metrics.jsonl's loss is the global batch's, once every rank's figures arrive).
  double loss = 0;
  double lr = 0;
  double loss_scale = 1;   // the scale this step's backward pass used (fp16)
  bool finite_loss = true;
  bool applied = false;    // the optimizer updated the weights (false: a skipped step)
  bool synced = false;     // local SGD: the step ended with a parameter average
  // The norm the optimizer clipped with (stale: of the last average applied); NaN: none.
  double grad_norm = std::nan("");
  RunStats pipeline;       // this rank's schedule span and busy time
  // Replicas not in lockstep (optim.staleness, local SGD): this rank's summed token losses (the global loss is
  // known once the figures of every rank arrive). optim.staleness: the age in steps of the averages it applied
  // (max, mean; 0 when it applied none).
  double local_loss_sum = 0;
  double staleness_max = 0, staleness_mean = 0;
  // Local SGD without train.skip_nonfinite: what became non-finite on this replica this step (the step is not
  // applied; the run stops at the next parameter average: stop_if_a_replica_was_nonfinite).
  std::string nonfinite;
  // Non-empty when the run must stop (a non-finite loss or norm without train.skip_nonfinite): every rank
  // returns a message at the same step, and the caller records the step, then stops them together.
  std::string stop;
};

// sync_point: the step ends in a state every replica shares (evaluation, checkpoint, the last step); matters only
// with optim.staleness, where it applies every gradient average still in flight.
StepResult train_step(TrainingRun& run, int step, bool sync_point, Profiler& prof);

// The optimizer phase of a step whose gradients `grads` are this rank's to apply (data_parallel.h's strategies call
// it): the step's lr and global loss, the optimizer's step, the loss scaler's update, and what a non-finite loss or
// norm does (skip the step, or out.stop). replica_alone (local SGD): the replica steps without the others, on its
// own loss and norm, and a non-finite one goes to out.nonfinite instead of out.stop.
void optimizer_update(TrainingRun& run, int step, const Tensor& grads, bool replica_alone, Profiler& prof,
                      StepResult& out);

// Local SGD, at the parameter average of `step` (collective over dp): out.stop, naming the earliest step, when any
// replica's loss or norm became non-finite since the last average (`first` > 0: this replica's first such step,
// and `what` became non-finite), so that the replicas stop together before averaging.
void stop_if_a_replica_was_nonfinite(TrainingRun& run, int step, int first, const std::string& what,
                                     StepResult& out);

// The mean validation loss over train.eval_batches global batches (the same windows each time), each dp rank
// taking its share, micro-batch by micro-batch through the pipeline. Collective over the world.
double evaluate(TrainingRun& run);

}  // namespace mt
