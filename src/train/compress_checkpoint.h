// Gradient compression's state in checkpoints (comm.compress int8, topk, powersgd; docs/compression.md): each
// rank's error-feedback residual and PowerSGD's Qs, so that a resumed run continues bit for bit.
#pragma once
#include <string>
#include <vector>

#include "model/pipeline_chunks.h"
#include "parallel/mesh.h"
#include "train/checkpoint.h"
#include "train/grad_reducers.h"

namespace mt {

// The residual's kind for rank q of the replica group (mesh.replica_rank()): "replica<q>/compress_residual".
std::string residual_kind(int q);

// Adds this rank's compression state to its shard: its residual, and on the first rank of each replica group
// PowerSGD's Qs (the same on every rank of the group). The last stage's copy of the tied wte is left to the first
// stage's, whose residual and Q equal it. Nothing without error feedback.
void add_compression_state(ChunkReducers& red, const PipelineChunks& model, const DeviceMesh& mesh,
                           CheckpointShard& shard);

// Restores what `info` holds of it into `red`, built for this run's setting: this rank's residual where the
// checkpoint has one (written on any tp x pp: it is laid out like the parameters, so it reshards like them; else it
// stays zero), the Qs where it has them for this tp degree and matrix shape. Returns which Qs start from a fresh
// draw ("" when none does).
std::string restore_compression_state(ChunkReducers& red, const PipelineChunks& model, const DeviceMesh& mesh,
                                      const CheckpointInfo& info);

}  // namespace mt
