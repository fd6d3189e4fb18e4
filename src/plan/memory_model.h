// The planner's memory model: the host tensor memory each rank of a layout holds at its peak, predicted from the
// config alone, as the trainer counts it in run.dir/memory.json's peak_tensor_bytes (owning tensors plus what
// arenas hand out: core/tensor.h). Formulas: docs/planner.md, "Memory model".
#pragma once
#include <vector>

#include "train/config.h"

namespace mt::plan {

// One pipeline rank's figures in bytes (dp rank 0 and tp rank 0: ZeRO-1's first shards are the largest, and tp
// ranks hold equal shards).
struct StageMemory {
  int pp_rank = 0;
  double params = 0;       // flat parameter buffer (compute dtype); ZeRO-3: this rank's parameter shards and its
                           // chunks' gathered-unit buffers
  double grads = 0;        // flat gradient buffer (fp32); ZeRO-2 and -3: the unit buffers and the gradient shards
  double optimizer = 0;    // AdamW moments (and fp32 masters with 16-bit compute), ZeRO: this rank's shards
  double dp_state = 0;     // 16-bit staging of the gradient buckets, compression state (error-feedback residuals,
                           // compressors' buffers), local SGD's anchor, momentum and staging
  double activations = 0;  // activation records (records x record bytes, per chunk)
  int records = 0;
  double buffers = 0;      // pipeline receive buffers (training list, plus evaluation's with train.eval_every)
  double scratch = 0;      // the backward pass's scratch arena, and under cp an attention call's temporaries
  double small = 0;        // one-element tensors (loss, metrics, optimizer scalars)
  double setup = 0;        // the set-up moment with 16-bit compute: the full fp32 masters before the optimizer
                           // takes its share (0 in fp32); ZeRO-3: the state alone (a new model is drawn into the
                           // gradients' buffers), or with a loaded model's whole fp32 buffer
  double training() const { return params + grads + optimizer + dp_state + activations + buffers + scratch + small; }
  double peak() const { return training() > setup ? training() : setup; }
};

struct MemoryPrediction {
  std::vector<StageMemory> stages;  // one per pipeline rank
  double peak = 0;                  // the largest peak over ranks (bytes)
  int worst_stage = 0;
};

// `cfg` has the layout applied (apply_layout) and passes validate(cfg, world).
MemoryPrediction predict_memory(const Config& cfg, int world);

}  // namespace mt::plan
