// The model code of one pipeline stage at a StageShape, ready to run its passes over `inflight` activation records
// used in turn: what the planner times (plan/calibration.h) and what its time-sharing probe runs in several
// processes at once (plan/time_sharing.h).
#pragma once
#include <cstdint>
#include <vector>

#include "core/arena.h"
#include "model/gpt.h"
#include "plan/calibration.h"
#include "plan/null_communicator.h"

namespace mt::plan {

// Deterministic values of a modest scale (no denormals, nothing that overflows) into any float tensor.
void fill_values(const Tensor& t, double scale, uint32_t salt);

class StagePasses {
 public:
  StagePasses(const ModelConfig& model, const StageShape& s);
  int inflight() const { return int(acts_.size()); }
  // Each returns its wall time in us. `record` picks the activation record (taken modulo inflight()).
  double forward(int record);
  double backward(int record);          // the whole backward, or with s.split the input pass
  double backward_weights(int record);  // s.split: the weight pass
  // The collectives the passes asked for since the last clear (the tp group's, then the cp ring's).
  CountingCommunicator tp, ring;

 private:
  StageShape s_;
  GPT model_;
  Arena records_, scratch_;
  std::vector<Activations> acts_;
  Tensor dout_, dinput_, loss_sum_;
  double dloss_ = 0;
};

}  // namespace mt::plan
