// The trainer's data-parallel gradient reducers: one GradReducer per model chunk with its buckets, wire dtype
// and compression from the config, and the hooks that hold the tied embedding back (see grad_buckets.h).
#pragma once
#include <memory>
#include <vector>

#include "model/pipeline_chunks.h"
#include "parallel/grad_buckets.h"
#include "parallel/sharded_grads.h"
#include "train/config.h"
#include "train/pipeline_runner.h"

namespace mt {

struct ChunkReducers {
  std::vector<std::unique_ptr<GradReducer>> owned;    // per chunk; null when nothing is reduced over dp or ZeRO-2
  std::vector<std::unique_ptr<ShardedGrads>> sharded;  // per chunk under ZeRO-2 (sharded_grads.h), else null
  std::vector<ChunkReduce> hooks;                     // per chunk, for the pipeline runner
  Tensor shard_grads;  // ZeRO-2: this rank's averaged gradient shards of every chunk, packed chunk v-1 first
  std::vector<std::unique_ptr<ParamGather>> gathers;  // ZeRO-1 and -2: per chunk, the parameter all-gather
};

// Whether the config shards the gradients (ZeRO-2 reducing every micro-batch, ZeRO-3): the model then has no flat gradient
// buffer, and each chunk's gradients live in its ShardedGrads.
bool sharded_gradients(const Config& cfg);

// Reducers for every chunk when the dp gradients need reducing (dp > 1 or ZeRO, and not local SGD, which
// averages parameters instead); logs the buckets, the wire bytes per step and the compression's state on rank 0.
// Under ZeRO-2 with optim.zero_reduce=step the buckets are ZeRO-1's (a whole gradient buffer, reduced once).
// host_dp: where dp is NCCL, a host transport over the same group for the compressors' collectives (GradReducer).
// ZeRO-2: the gradient units of a chunk of stage config `g` with parameter table `table` (sharded_grads.h): its
// embedding unit is pinned when it holds the tied head, every unit under the zb1 schedule; blocks cut in three under
// optim.zero_unit: sublayer.
std::vector<GradUnit> chunk_grad_units(const Config& cfg, const GPTConfig& g, const ParamTable& table);
// ZeRO-3: whether each pass gathers the units again (parallel.reshard_after_forward, auto resolved: not with pp).
bool reshards_after_forward(const Config& cfg);
// ZeRO-3: the parameter units of such a chunk (sharded_params.h): the gradient units' ranges; the embedding unit
// pinned when it holds the tied head, every unit when the passes do not reshard.
std::vector<GradUnit> chunk_param_units(const Config& cfg, const GPTConfig& g, const ParamTable& table);
// ZeRO-2 and -3: how a chunk's ShardedGrads keeps its ring, for dp data-parallel ranks (not counting cp) and the
// model's compute and gradient dtypes: shared with ZeRO-3's parameters where both ring over the same units (the
// passes reshard, no zb1) in one dtype, and reducing once where a step has one micro-batch per rank.
ShardedGradsOptions sharded_grads_options(const Config& cfg, int dp, DType compute, DType grads);

// comm.compress's options for a run's reducers (the planner's memory model builds the same).
CompressOptions compress_options(const Config& cfg);
// Where the model holds the tied wte twice (more than one pipeline stage): its index in a chunk's table that holds
// a copy, else -1.
int tied_copy_param(const Config& cfg, const GPTConfig& g, const ParamTable& table);
// A chunk's gradient buckets (comm.bucket_mb over its table's flat layout, grad_buckets.h). Under int8, topk and
// powersgd the tied wte copy (`tied`, -1: none) gets a bucket of its own (docs/compression.md, "Copies of a
// parameter").
std::vector<Bucket> chunk_buckets(const Config& cfg, const ParamTable& table, size_t elem_bytes, int tied);

// Whether any chunk reduces over dp.
inline bool reduces(const ChunkReducers& r) { return !r.owned.empty() && (r.owned[0] || r.sharded[0]); }
// The step's end: every chunk's reductions launched and waited for (chunk v-1 first).
void finish_reductions(ChunkReducers& r);
// After a step the optimizer skipped: every chunk's compression forgets its error feedback.
void reset_feedback(ChunkReducers& r);
// ZeRO-1 and -2: every dp rank's updated shards of `flat` (laid out like model.params()) gathered in place.
void all_gather_params(ChunkReducers& r, const PipelineChunks& model, const Tensor& flat);
// ZeRO-1 and -2: the model's parameters gathered in the background (param_gather.h), chunk 0 first (the next
// step's first forward pass), for the forward passes to wait for; and waiting for all of it.
void launch_param_gathers(ChunkReducers& r, const PipelineChunks& model);
void wait_param_gathers(ChunkReducers& r);
// The gradients' bytes on this rank: the flat buffer, or ZeRO-2's unit buffers and shards.
int64_t gradient_bytes(const ChunkReducers& r, const PipelineChunks& model);

ChunkReducers make_grad_reducers(const Config& cfg, const PipelineChunks& model, Communicator& dp, int dp_size,
                                 bool log, Communicator* host_dp = nullptr);

}  // namespace mt
