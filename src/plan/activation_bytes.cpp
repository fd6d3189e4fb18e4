// The model's arena allocations, counted (see activation_bytes.h): the model's own allocation code run on a counting
// arena, so there is nothing to keep in step.
#include "plan/activation_bytes.h"

#include "core/arena.h"
#include "plan/null_communicator.h"

namespace mt::plan {

namespace {

// A stage with no parameter or gradient buffers: only its allocation code runs. Under context parallelism it has a cp
// group of the right size (a null one: nothing runs) so that it allocates the ring's record.
struct CountingStage {
  CountingStage(const StageConfig& g, DType dt, int cp)
      : cp_group(cp, 0), model(g.model, g.part, dt, Device::CPU, {}, {}, true) {
    if (cp > 1) model.set_cp_comm(&cp_group);
  }
  NullCommunicator cp_group;
  GPT model;
};

}  // namespace

int64_t record_bytes(const StageConfig& g, int B, int T, DType dt, bool split, int cp) {
  const CountingStage stage(g, dt, cp);
  const GPT& model = stage.model;
  Arena counter{Arena::CountOnly{}};
  const Activations a = model.alloc_activations(counter, B, T, split);
  if (!g.first()) counter.alloc(a.input().shape(), dt);  // dinput, sent to the previous stage
  return int64_t(counter.high_water_bytes());
}

int64_t backward_scratch_bytes(const StageConfig& g, int B, int T, DType dt, bool split, int cp,
                               bool grads_over_params) {
  CountingStage stage(g, dt, cp);
  stage.model.set_grads_over_params(grads_over_params);
  const GPT& model = stage.model;
  Arena records{Arena::CountOnly{}}, scratch{Arena::CountOnly{}};
  model.alloc_backward_scratch(scratch, model.alloc_activations(records, B, T, split), split);
  return int64_t(scratch.high_water_bytes());
}

int64_t attention_temp_bytes(const StageConfig& g, int B, int T, DType dt, int cp) {
  return g.blocks() == 0 ? 0 : CountingStage(g, dt, cp).model.attention_temp_bytes(B, T);
}

int64_t recv_buffer_bytes(const StageConfig& g, int B, int T, DType dt) {
  return arena_bytes(g.part.sharding.rows(int64_t(B) * T) * g.model.d_model, dt);
}

}  // namespace mt::plan
