// The step loop's side of checkpoints: this rank's shard of the training state for write_checkpoint, and the
// state restored from a checkpoint (train/checkpoint.h has the format).
#pragma once
#include "model/pipeline_chunks.h"
#include "optim/optimizer.h"
#include "parallel/mesh.h"
#include "train/checkpoint.h"

namespace mt {

// This rank's optimizer state in the model table's layout and the segments it writes: under ZeRO-1 its own
// shards; without, the dp replicas hold the same state and only dp rank 0 writes it. The last stage's copy of
// the tied wte (outside the gradient norm) is left to the first stage's.
CheckpointShard checkpoint_shard(const PipelineChunks& model, const Optimizer& opt, const DeviceMesh& mesh, bool zero);

// Reads and verifies `dir` (InputError naming the file), then replaces the optimizer's masters, moments and step
// count and the model's compute copy with the checkpoint's, laid out for this rank whatever mesh wrote it.
CheckpointInfo restore_checkpoint(const std::string& dir, const Config& cfg, PipelineChunks& model, Optimizer& opt);

}  // namespace mt
