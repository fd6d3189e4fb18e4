// ZeRO glue between the gradient buckets and the optimizer: the optimizer segments of this rank's shards, split at
// parameter boundaries (for weight decay), with their moments packed.
#pragma once
#include <vector>

#include "model/param_table.h"
#include "optim/optimizer.h"
#include "parallel/grad_buckets.h"

namespace mt {

// One segment per (bucket, parameter) overlap of this rank's shards (shard_range over each bucket): offset into
// the flat params (and, under ZeRO-1, grads), state offset into the packed moments (and, under ZeRO-2, the packed
// gradient shards).
std::vector<OptimSegment> zero_segments(const ParamTable& table, const std::vector<Bucket>& buckets, int dp, int rank);

}  // namespace mt
