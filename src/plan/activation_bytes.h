// Bytes the trainer takes from arenas per micro-batch, computed without allocating: GPT::alloc_activations (one
// activation record, plus the input-gradient buffer the pipeline executor adds for a stage after the first) and
// GPT::alloc_backward_scratch (what GPT::backward takes first) run on a counting arena (core/arena.h), so a change
// to the model's records changes these with it. Arena allocations are rounded up to 64 bytes each, as Arena::alloc
// does. tests/test_planner.cpp checks them against a real arena's.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "plan/stage_config.h"

namespace mt::plan {

// Rounds one allocation up as Arena::alloc does.
inline int64_t arena_bytes(int64_t numel, DType t) { return (numel * int64_t(dtype_size(t)) + 63) / 64 * 64; }
// Rounds one owning tensor up as Tensor::empty does (at least 64 bytes).
inline int64_t tensor_bytes(int64_t numel, DType t) {
  const int64_t b = (numel * int64_t(dtype_size(t)) + 63) / 64 * 64;
  return b < 64 ? 64 : b;
}

// One activation record of stage `g` for B sequences of T tokens in `dtype` (split: what the zero-bubble weight
// pass keeps too), plus the input-gradient buffer when the stage is not the first (PipelineRunner::acquire). With
// cp > 1, T is a cp rank's tokens of each sequence and attention keeps the ring's record (its log-sum-exp).
int64_t record_bytes(const StageConfig& g, int B, int T, DType dtype, bool split, int cp = 1);

// What one backward pass of stage `g` takes from the executor's scratch arena (held until the next backward);
// grads_over_params: ZeRO-3's shared ring (GPT::set_grads_over_params: the norms' gradients go through scratch).
int64_t backward_scratch_bytes(const StageConfig& g, int B, int T, DType dtype, bool split, int cp = 1,
                               bool grads_over_params = false);

// What one attention call of stage `g` allocates for its time under context parallelism (GPT::attention_temp_bytes):
// 0 with cp = 1.
int64_t attention_temp_bytes(const StageConfig& g, int B, int T, DType dtype, int cp);

// One pipeline receive buffer of stage `g` ([rows, C]: rows = B*T, or B*T/tp with sequence parallelism).
int64_t recv_buffer_bytes(const StageConfig& g, int B, int T, DType dtype);

}  // namespace mt::plan
