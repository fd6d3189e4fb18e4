// The trainer's data-parallel gradient reducers: one GradReducer per model chunk with its buckets, wire dtype
// and compression from the config, and the hooks that hold the tied embedding back (see grad_buckets.h).
#pragma once
#include <memory>
#include <vector>

#include "model/pipeline_chunks.h"
#include "parallel/grad_buckets.h"
#include "train/config.h"
#include "train/pipeline_runner.h"

namespace mt {

struct ChunkReducers {
  std::vector<std::unique_ptr<GradReducer>> owned;  // per chunk; null when nothing is reduced over dp
  std::vector<ChunkReduce> hooks;                   // per chunk, for the pipeline runner
};

// Reducers for every chunk when the dp gradients need reducing (dp > 1 or ZeRO-1, and not local SGD, which
// averages parameters instead); logs the buckets, the wire bytes per step and the compression's state on rank 0.
// host_dp: where dp is NCCL, a host transport over the same group for the compressors' collectives (GradReducer).
ChunkReducers make_grad_reducers(const Config& cfg, const PipelineChunks& model, Communicator& dp, int dp_size,
                                 bool log, Communicator* host_dp = nullptr);

}  // namespace mt
