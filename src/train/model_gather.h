// The whole model's full tensors, gathered from every tensor- and pipeline-parallel shard, written as one
// safetensors file (the final export and run.dump_grads). Each tp group assembles its stage's full tensors
// (model/tp_shard.h); each pipeline stage's tp rank 0 sends them to stage 0, which writes the file under the
// single-rank model's layout. The same file as a single-rank run's GPT::export_safetensors for the same weights.
#pragma once
#include <string>
#include <vector>

#include "model/pipeline_chunks.h"
#include "parallel/mesh.h"

namespace mt {

// `flat` is this rank's flat buffer laid out by model.table() (parameters or gradients, F32). Collective over
// the ranks with dp_rank 0 (others return at once); world rank 0 writes `path`. base: the whole model's
// GPTConfig; layers_per_stage as for PipelineChunks.
void write_gathered_safetensors(const std::string& path, const PipelineChunks& model, const Tensor& flat,
                                const DeviceMesh& mesh, MeshComms& comms, const GPTConfig& base,
                                const std::vector<int>& layers_per_stage);

}  // namespace mt
