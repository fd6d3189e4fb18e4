// The step loop's side of checkpoints: this rank's shard of the training state for write_checkpoint, and the
// state restored from a checkpoint (train/checkpoint.h has the format).
#pragma once
#include <functional>

#include "model/pipeline_chunks.h"
#include "optim/optimizer.h"
#include "parallel/mesh.h"
#include "train/checkpoint.h"

namespace mt {

// This rank's optimizer state in the model table's layout and the segments it writes: under ZeRO-1 its own
// shards; without, the dp replicas hold the same state and only dp rank 0 writes it. The last stage's copy of
// the tied wte (outside the gradient norm) is left to the first stage's. params: what the optimizer steps (the
// model's flat parameters, or ZeRO-3's packed shards), whose segments are the weights when no masters are kept.
CheckpointShard checkpoint_shard(const PipelineChunks& model, const Tensor& params, const Optimizer& opt,
                                 const DeviceMesh& mesh, bool zero);

// Sets the compute copy of the elements [offset, offset + part.numel()) of the rank's flat layout from fp32 values.
using WeightsSink = std::function<void(const Tensor& part, int64_t offset)>;

// Reads and verifies `dir` (InputError naming the file), then replaces the optimizer's masters, moments and step
// count and the model's compute copy (through `weights`) with the checkpoint's, laid out for this rank whatever
// mesh wrote it.
CheckpointInfo restore_checkpoint(const std::string& dir, const Config& cfg, const PipelineChunks& model,
                                  Optimizer& opt, const WeightsSink& weights);

// The learning-rate schedule of a run resumed after `step` against the one its checkpoint trained under (`yaml`,
// the checkpoint's resolved config): "" where they agree (or the checkpoint has no config), else a warning naming
// the keys that differ and the learning rate the next step takes under each. Extending train.steps is a fair thing
// to do, but it reshapes the decay mid-run, which nothing else would show.
std::string schedule_change(const std::string& yaml, const Config& cfg, int64_t step);

}  // namespace mt
