// What the pipeline executor calls on one model chunk's data-parallel gradient reduction around each of that
// chunk's gradient passes (a backward pass, or a zero-bubble input or weight pass). Two implementations:
// GradReducer (grad_buckets.h: plain all-reduce and ZeRO-1, reducing once per step on the last pass) and
// ShardedGrads (sharded_grads.h: ZeRO-2, reducing every pass).
#pragma once
#include <cstdint>

namespace mt {

class ChunkGradSync {
 public:
  virtual ~ChunkGradSync() = default;
  // A gradient pass of the chunk starts; `final`: the chunk's last of the step. Returns whether the pass must
  // report its finished gradients through grads_ready().
  virtual bool begin_pass(bool final, bool overlap) = 0;
  // The backward pass's hook: the chunk's gradients [0, end) of its layout stop changing for this pass.
  virtual void grads_ready(int64_t end) = 0;
};

}  // namespace mt
