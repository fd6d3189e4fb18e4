// ZeRO-3's parameter all-gathers inside a chunk's passes (parallel/sharded_params.h), as the planner charges them.
// The requests are the model's own (GPT::forward's and backward's params_needed, mirrored here), and the store's
// rules decide what each one gathers: a request gathers every unit it touches that is not resident and waits for
// it, then prefetches the next unit in the pass's order (the forward pass walks down the layout, the backward pass
// up), whose gather then overlaps the compute up to the next request. A pass's start forgets the unpinned units (a
// backward pass right after a forward pass keeps the ring's first two, a forward pass after a backward pass its last
// two unless the ring is shared with the gradients), the step's start every unit. So with
// parallel.reshard_after_forward each forward and backward pass gathers its units again, and the pass waits for
// its first units in full and for what each prefetch outlasts; without it (every unit pinned) the gathers issued
// after the optimizer bring them all (counted in the chunk's first forward pass), and nothing gathers after them.
// tests/test_planner.cpp checks the gathers against a ShardedParams driven by the model's passes.
#pragma once
#include <cstdint>
#include <vector>

#include "parallel/schedule.h"
#include "parallel/sharded_grads.h"
#include "plan/stage_config.h"

namespace mt::plan {

// Multiply-adds per row of a stage's parts, by which the planner splits a pass's measured time (the gradient
// buckets' ready points, the gathers' overlap): the head (last stage), each block's MLP and attention halves (the
// attention's T C score work outside zb1's weight pass), the embedding (first stage).
struct StageWork {
  double head = 0, mlp = 0, attn = 0, embedding = 0;
  double mlp_out = 0, attn_out = 0;  // of mlp and attn: the output projections', whose backward comes first
  double block() const { return mlp + attn; }
};
StageWork stage_work(const StageConfig& g, bool weight_pass);

// One params_needed request of a pass: the elements [begin, end) it asks for (the forward pass asks from `begin`
// up to its previous request), and the pass's compute from it to the next request (or the pass's end), as a share
// of the pass's multiply-adds.
struct ParamRequest {
  int64_t begin = 0, end = 0;
  double work_after = 0;
};

// The requests of one pass of stage `g` (table `t`) in order: a Forward, a Backward or BackwardInput (the same
// requests), or zb1's BackwardWeight (which reads parameters only under train.recompute: light). A pass that
// computes before its first request starts with an empty request.
std::vector<ParamRequest> param_requests(const StageConfig& g, const ParamTable& t, ActionKind pass);
// Under read-driven units: each unit in the order a Forward or Backward pass first reads it, with the compute
// that follows (its own parts' multiply-adds).
std::vector<ParamRequest> unit_reads(const StageConfig& g, const ParamTable& t, const std::vector<GradUnit>& units,
                                     ActionKind pass);

// One bucket of a unit's gather: its elements and its all-gather's time.
struct GatherBucket {
  int64_t begin = 0, end = 0;
  double us = 0;
};

// What one pass gathered.
struct PassGathers {
  std::vector<int> units;       // the units gathered, in the order they were issued
  std::vector<double> issued;   // when each was issued, as a share of the pass's length (its waits included)
  std::vector<double> busy_us;  // each one's time on the data-parallel communicator
  double wait_us = 0;           // how long the pass waited for them
  int64_t bytes = 0;            // the gathered units' bytes (all-gather outputs)
  double cpu_us = 0;            // the communication thread's CPU time for them (NetModel::cpu_us)
  int not_prefetched = 0;       // of the units, those a request gathered itself (waited for in full)
};

// One chunk's parameter store over a step, as ShardedParams keeps it.
class ChunkParamGathers {
 public:
  // units: the chunk's parameter units (chunk_param_units); unit_us: each unit's gather time (its buckets'
  // all-gathers one after another); elem_bytes: the compute dtype's size; shared_ring: the ring's two slots are
  // shared with the gradients (ShardedGradsOptions); unit_cpu_us: each unit's gather's CPU time on the
  // communication thread (none when empty);
  // buckets: each unit's buckets in layout order, when a pass waits for each parameter's bucket alone
  // (ShardedParams::reader), else empty (a request waits for its units in full).
  // read_driven: sub-block units (optim.zero_unit: sublayer, ShardedParams::set_read_driven): each unit is a request
  // of its own when the pass first reads it (a pinned unit's prefetches nothing).
  ChunkParamGathers(const StageConfig& g, const ParamTable& t, std::vector<GradUnit> units, std::vector<double> unit_us,
                    int elem_bytes, bool shared_ring, std::vector<double> unit_cpu_us = {},
                    std::vector<std::vector<GatherBucket>> buckets = {}, bool read_driven = false);
  void begin_step();  // the optimizer changed the shards: no unit is resident
  // After begin_step: the next forward pass's first units (the end of the layout: the embeddings and the first
  // block; every unit when all are pinned) gathered in the background since head_start_us before that pass starts,
  // as the trainer issues them after the optimizer (ShardedParams::prefetch_forward_start). That pass lists them
  // among its gathers, issued at its start.
  void prefetch_forward_start(double head_start_us);
  // One pass of `kind` whose compute takes work_us at full speed: its gathers and its waits for them.
  PassGathers pass(ActionKind kind, double work_us);

 private:
  const std::vector<ParamRequest>& requests(ActionKind kind) const;
  std::vector<GradUnit> units_;
  std::vector<double> unit_us_, unit_cpu_us_;
  std::vector<std::vector<GatherBucket>> buckets_;
  int elem_bytes_;
  bool shared_;                // the ring's slots are shared with the gradients
  bool read_driven_;           // one request per unit, at its first read
  std::vector<ParamRequest> forward_, backward_, weight_;
  std::vector<bool> resident_;
  std::vector<double> early_;  // per unit: when prefetch_forward_start's gather completes, from the next pass's start
  std::vector<bool> early_in_flight_;
  std::vector<int> slot_;      // per unit: its ring slot, -1 when pinned
  std::vector<int> occupant_;  // per ring slot: the unit in it, or -1
  ActionKind last_pass_ = ActionKind::Forward;  // the chunk's previous pass in the step
};

}  // namespace mt::plan
