// The step loop's side of checkpoints: this rank's shard of the training state for write_checkpoint, and the
// state restored from a checkpoint (train/checkpoint.h has the format).
#pragma once
#include <functional>
#include <string>
#include <vector>

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

// `t`'s fp32 values in host memory for the writer: viewed where they live, or downloaded from a GPU into
// shard.host_copies (to_host waits for the step's kernels).
const float* checkpoint_host_view(CheckpointShard& shard, const Tensor& t);

// Sets the compute copy of the elements [offset, offset + part.numel()) of the rank's flat layout from fp32 values.
using WeightsSink = std::function<void(const Tensor& part, int64_t offset)>;

// Reads and verifies `dir` (InputError naming the file), then replaces the optimizer's masters, moments and step
// count and the model's compute copy (through `weights`) with the checkpoint's, laid out for this rank whatever
// mesh wrote it. The returned info keeps the rank files for the strategy's own state (DataParallel::restore_from).
CheckpointInfo restore_checkpoint(const std::string& dir, const Config& cfg, const PipelineChunks& model,
                                  Optimizer& opt, const WeightsSink& weights);

// What a run resumed after `step` continues differently from the run that wrote its checkpoint, which no tensor
// shows (`yaml`: the checkpoint's resolved config), each a warning naming the keys and what follows: the
// learning-rate schedule (train.steps, optim.schedule, lr, min_lr, warmup_steps: the next step's rate under each),
// the update (optim.weight_decay, beta1, beta2, eps, momentum, train.grad_clip) and the data stream
// (train.global_batch, train.seed, data.order: the samples skipped or read again). Changing them is fair (a longer
// run, a larger batch), but it reshapes the run mid-way without a word otherwise.
std::vector<std::string> resume_changes(const std::string& yaml, const Config& cfg, int64_t step);

// The state a resumed run starts afresh because checkpoints do not hold it, each a warning: comm.adapt's
// controller's measurements (it starts again from the setting the checkpoint holds).
std::vector<std::string> resume_restarts(const Config& cfg);

}  // namespace mt
