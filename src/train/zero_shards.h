// ZeRO-1 glue between the gradient buckets and the optimizer: the optimizer segments of this rank's shards,
// split at parameter boundaries (for weight decay), with their moments packed.
#pragma once
#include <vector>

#include "model/param_table.h"
#include "optim/optimizer.h"
#include "parallel/grad_buckets.h"

namespace mt {

// One segment per (bucket, parameter) overlap of this rank's shards: offset into the flat params/grads, state
// offset into the packed moments.
std::vector<OptimSegment> zero_segments(const ParamTable& table, const GradReducer& reducer);

}  // namespace mt
