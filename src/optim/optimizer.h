// The optimizer step over flat buffers: global gradient-norm clipping, then AdamW segment by segment (decay on
// matrices and embeddings only). A segment is a range of the params and grads buffers and a range of the moment
// buffers: one per parameter for a full optimizer, or the pieces of this rank's shards under ZeRO-1 (moments
// packed, so they take 1/dp of the memory). fp32 moments live here.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "kernels/adamw.h"
#include "model/param_table.h"

namespace mt {

struct OptimizerSettings {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;  // 0 = off
};

struct OptimSegment {
  int64_t offset = 0;        // into the params and grads buffers
  int64_t state_offset = 0;  // into the moment buffers
  int64_t numel = 0;
  bool decay = false;
  bool tp_sharded = false;  // a tensor-parallel shard (tp ranks hold different elements), not a replicated tensor
  bool in_norm = true;      // false for a copy counted elsewhere (the last pipeline stage's tied wte)
};

// One segment per parameter of the table, at its offset in the flat buffers.
std::vector<OptimSegment> param_segments(const ParamTable& table);

class Optimizer {
 public:
  // state_numel: length of the moment buffers (>= every segment's state end). norm_group: when the segments
  // cover only this rank's shard (ZeRO-1), the group whose sums of squares make the global norm; nullptr when
  // they cover every parameter. tp_group: with tensor parallelism, the tp group: the sums of squares of the
  // tp_sharded segments are all-reduced over it and the replicated ones counted locally, so every parameter is
  // counted once over the mesh (nullptr, or a group of one rank: no tensor parallelism). pp_group: with pipeline
  // parallelism, the stages whose sums of squares add up to the whole model's.
  Optimizer(std::vector<OptimSegment> segments, int64_t state_numel, DType dtype, Device device,
            const OptimizerSettings& s, Communicator* norm_group = nullptr, Communicator* tp_group = nullptr,
            Communicator* pp_group = nullptr);

  // One update with learning rate `lr` of the segments of `params` from the same segments of `grads`. Leaves
  // the gradient's global norm (before clipping) in grad_norm()[0] on the device; nothing is read back.
  void step(const Tensor& params, const Tensor& grads, double lr);
  const Tensor& grad_norm() const { return norm_; }
  int64_t steps_taken() const { return t_; }
  size_t state_bytes() const { return m_.nbytes() + v_.nbytes(); }

 private:
  std::vector<OptimSegment> segments_;
  OptimizerSettings s_;
  Communicator* norm_group_;
  Communicator* tp_group_;
  Communicator* pp_group_;
  Tensor m_, v_;
  Tensor norm_sq_, norm_, scale_;  // 1-element device scalars
  Tensor rep_sq_;                  // replicated segments' sum of squares (tensor parallelism only)
  int64_t t_ = 0;
};

}  // namespace mt
