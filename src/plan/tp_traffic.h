// The tensor-parallel collectives inside one stage's passes (GPT::forward, backward, backward_weights): Megatron's
// f/g all-reduces, or with sequence parallelism the all-gathers and reduce-scatters that replace them, and the
// vocabulary-parallel cross-entropy's two all-reduces. Each one blocks the compute thread, so its whole time is
// in the pass.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/comm_options.h"
#include "plan/calibration.h"
#include "train/config.h"

namespace mt::plan {

struct TpOp {
  CommKind kind;
  int64_t bytes;  // as predict_us takes them (all-gather: the output; reduce-scatter: the input)
};

struct TpTraffic {
  std::vector<TpOp> fwd, bwd, bwd_input, bwd_weight;
};

// The collectives of a stage of shape `s` (s.tp > 1; none when s.tp == 1).
TpTraffic tp_traffic(const ModelConfig& m, const StageShape& s);

}  // namespace mt::plan
