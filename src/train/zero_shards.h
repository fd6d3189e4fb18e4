// ZeRO-1 glue between the gradient buckets and the optimizer: which pieces of the packed shard buffers belong
// to which parameter (for weight decay), and the initial fp32 master shards.
#pragma once
#include <vector>

#include "model/param_table.h"
#include "optim/optimizer.h"
#include "parallel/grad_buckets.h"

namespace mt {

// One segment per (bucket, parameter) overlap of this rank's shards, at its offset in the packed layout.
std::vector<OptimSegment> zero_segments(const ParamTable& table, const GradReducer& reducer);

// Copies this rank's shards of the full flat `params` into the packed buffer `shards`.
void copy_own_shards(const GradReducer& reducer, const Tensor& params, const Tensor& shards);

}  // namespace mt
