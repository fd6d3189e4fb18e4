// How the data-parallel replicas combine each step's work: one strategy per run, chosen once when the run is built
// (make_data_parallel), from optim.zero, optim.sync_every and optim.staleness:
//   synchronous  every step's gradients averaged over dp before the optimizer steps: a bucketed all-reduce
//                (ZeRO-0), or a reduce-scatter into the optimizer's shards and an all-gather of the updated
//                parameters hidden behind the next forward pass (ZeRO-1; ZeRO-2 shards the gradients too,
//                grad_reducers.h); with one replica there is nothing to reduce; ZeRO-3 shards the parameters
//                too, each unit gathered as a pass reaches it (parallel/sharded_params.h);
//   local SGD    each replica steps on its own gradients, and the replicas average their parameters every
//                optim.sync_every steps (optim/local_sgd.h);
//   stale        gradient averages run in the background, and a replica applies each one when it is ready or at
//                most optim.staleness steps late (parallel/stale_gradients.h).
// A step (train_step.h) runs the phases in order: begin_step, the pipeline's passes with hooks(), the tied
// embedding's sum, update(). Whatever reads the parameters between steps calls wait_params() first.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/pipeline_chunks.h"
#include "optim/optimizer.h"
#include "parallel/mesh.h"
#include "train/config.h"
#include "train/pipeline_runner.h"

namespace mt {

struct TrainingRun;
struct StepResult;
struct StepMetrics;
struct AdaptSample;
struct CheckpointShard;
struct CheckpointInfo;
class Profiler;

class DataParallel {
 public:
  virtual ~DataParallel() = default;

  // --- built once ---
  // This rank's optimizer segments and the elements of its state: every parameter, or ZeRO's shards.
  virtual std::vector<OptimSegment> optimizer_segments(const PipelineChunks& model, int64_t& state_numel,
                                                       OptimizerSettings& os) const;
  // Whether the optimizer holds only this rank's shards (ZeRO): its norm sums over dp, its checkpoint is sharded.
  virtual bool shards_optimizer() const { return false; }
  // Whether the model holds only this rank's shards of its parameters (ZeRO-3): no flat parameter buffer.
  virtual bool shards_parameters() const { return false; }
  // The parameters the optimizer steps: the model's flat buffer, or ZeRO-3's packed shards.
  virtual Tensor optimizer_params(const PipelineChunks& model) const { return model.params(); }
  // The compute copy of the elements [offset, offset + part.numel()) of the rank's flat layout set from `part`
  // (fp32 weights: initialisation, a loaded model, a checkpoint).
  virtual void set_weights(PipelineChunks& model, const Tensor& part, int64_t offset);
  // Once the optimizer exists: what the strategy builds from it (local SGD's outer state), comm.adapt's controller,
  // and the start-up log line.
  virtual void attach(TrainingRun&) {}

  // --- each step ---
  // The gradient storage the step accumulates into, zeroed before its passes.
  virtual void begin_step(PipelineChunks& model);
  // Per chunk, what the gradient passes start (a reducer) and wait for (ZeRO's parameter gather).
  const std::vector<ChunkReduce>& hooks() const { return hooks_; }
  // After the passes: the weights' update (StepResult's lr, loss, applied, synced, grad_norm, stop).
  virtual void update(TrainingRun& r, int step, bool sync_point, Profiler& prof, StepResult& out) = 0;
  // comm.adapt: whether a controller tunes this strategy, and its observation of a finished step.
  virtual bool adapts() const { return false; }
  virtual void adapt_after_step(TrainingRun&, int /*step*/, bool /*synced*/, const AdaptSample&, StepMetrics&) {}

  // --- between steps ---
  // Before anything outside a step reads the parameters (evaluation, checkpoint, export).
  virtual void wait_params() {}
  // The export's fp32 weights: `flat` (laid out like the parameters) completed from every rank's shards (ZeRO).
  virtual void gather_shards(const PipelineChunks&, const Tensor&) {}
  // Every replica ends every step at the same step (false: local SGD and stale, whose replicas meet only at their
  // averages: their rows are known once every rank's figures arrive).
  virtual bool lockstep() const { return true; }
  // Checkpoints: whether one waits for the next parameter average (local SGD, whose replicas share their weights
  // only there; the stop signals' vote is cast there too), what the strategy adds to this rank's shard, and what it
  // restores from a checkpoint once the optimizer holds its standard state.
  virtual bool checkpoints_wait_for_average() const { return false; }
  virtual void add_to_checkpoint(TrainingRun&, CheckpointShard&) {}
  virtual void restore_from(TrainingRun& r, const CheckpointInfo& info);
  // The gradients' bytes on this rank, and what the memory log line says of the sharded state.
  virtual int64_t gradient_bytes(const PipelineChunks& model) const { return int64_t(model.grads().nbytes()); }
  // The parameters' bytes on this rank (ZeRO-3: its shards and the gathered units' buffers).
  virtual int64_t parameter_bytes(const PipelineChunks& model) const { return int64_t(model.params().nbytes()); }
  virtual std::string memory_note(bool mixed) const;

 protected:
  std::vector<ChunkReduce> hooks_;  // one per chunk; empty entries where nothing runs during the passes
};

// The run's strategy. Under ZeRO-2 and -3 it gives the model chunks their gradient views (sharded_grads.h), under
// ZeRO-3 their parameter views too (the model was built without flat buffers); rank 0 logs the buckets (log).
std::unique_ptr<DataParallel> make_data_parallel(const Config& cfg, const DeviceMesh& mesh, MeshComms& comms,
                                                 PipelineChunks& model, bool on_demand_gathers, bool log);

}  // namespace mt
