// The pipeline executor: runs one rank's schedule (a list of actions from parallel/schedule.h) over its model
// chunks. Receives are all posted when a run starts, each into its own buffer, so a neighbour's send never
// waits for this rank to reach the matching receive; sends go out asynchronously from the activation record
// (activations) or the record's input-gradient buffer. Each micro-batch's activation record comes from a pool
// when its forward pass starts and goes back as soon as its last backward action (and its sends) are done, so
// each chunk's pool grows to the most records the schedule keeps in flight at once, and the same action list
// every step reuses them (receive buffers are allocated once per action list). With pp = 1 the same executor runs the plain forward-backward loop (the 1f1b list of one stage).
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "core/arena.h"
#include "model/pipeline_chunks.h"
#include "parallel/grad_sync.h"
#include "parallel/param_gather.h"
#include "parallel/schedule.h"
#include "parallel/sharded_params.h"
#include "train/profiler.h"
#include "train/straggler.h"

namespace mt {

// Writes micro-batch `mb`'s tokens and targets (micro_batch x seq_len int32 each).
using FillFn = std::function<void(int mb, int32_t* tokens, int32_t* targets)>;

// Data parallelism for one chunk: its reducer (over the chunk's part of the flat gradient buffer) and how far
// into the chunk the backward pass may report gradients as final (the tied wte is held back until the trainer
// has summed it between the first and last stage).
struct ChunkReduce {
  ChunkGradSync* reducer = nullptr;
  int64_t ready_limit = INT64_MAX;
  ParamGather* gather = nullptr;  // ZeRO-1, -2: the previous step's parameter all-gather, waited for in forward
  ShardedParams* params = nullptr;  // ZeRO-3: the chunk's sharded parameters, gathered unit by unit in every pass
};

struct RunStats {
  double span_ms = 0;       // from the first action to the last
  double busy_ms = 0;       // in forward and backward passes
  double final_backward_ms = 0;  // the longest of the chunks' last gradient passes (the buckets' overlap window)
};

class PipelineRunner {
 public:
  // p pipeline ranks (pp: their communicator, nullptr when p == 1); m micro-batches of B x T per step;
  PipelineRunner(PipelineChunks& model, Communicator* pp, PipelineSchedule schedule, int m, int B, int T,
                 Profiler& prof);

  // One training step: every micro-batch's forward (the last stage adds its summed losses to loss_sum and
  // starts the backward with dloss) and backward, accumulating into the gradient buffer. Each gradient pass of a
  // chunk tells its reducer it begins (ChunkGradSync::begin_pass) and, where the reducer asks, reports its
  // gradients as they become final: GradReducer asks on the final pass with overlap, ShardedGrads on every pass.
  // `reduce` has one entry per chunk, or none (no data parallelism).
  RunStats train(const FillFn& fill, double dloss, const Tensor& loss_sum, const std::vector<ChunkReduce>& reduce,
                 bool overlap);
  // Forward passes only over n micro-batches (evaluation): the last stage adds the summed losses to loss_sum.
  // `gathers`: per chunk, its parameters' gathers (ZeRO), or none.
  RunStats forward_only(int n, const FillFn& fill, const Tensor& loss_sum, const std::vector<ChunkReduce>& gathers = {});

  // train.straggler's slowdown of this rank: every forward and backward pass takes `factor` times as long, the
  // extra spent sleeping, with the gradient buckets issued as late as the slower pass would issue them.
  void set_compute_stretch(double factor) { stretch_ = ComputeStretch(factor); }

  const std::vector<Action>& actions() const { return train_.actions; }
  // Activation records allocated so far per chunk (the most ever alive at once) and their bytes per record.
  int records(int chunk) const { return static_cast<int>(pool_[chunk].size()); }
  size_t record_bytes(int chunk) const;
  size_t buffer_bytes() const;  // receive buffers of both action lists

 private:
  struct Record {
    std::unique_ptr<Arena> arena;
    Activations acts;
    Tensor dinput;              // d(loss)/d(input) sent to the previous stage
    std::vector<WorkPtr> sends;  // in flight from this record
    bool busy = false;
  };
  struct Plan {
    std::vector<Action> actions;
    std::vector<Tensor> recv_buf;   // per action: the receive buffer (Recv actions only)
    std::vector<bool> releases;     // per action: the record of (chunk, mb) goes back to the pool after it
    std::vector<bool> final_grads;  // per action: the chunk's last gradient pass of the step
  };
  Plan make_plan(std::vector<Action> actions);
  RunStats run(Plan& plan, const FillFn& fill, double dloss, const Tensor& loss_sum,
               const std::vector<ChunkReduce>* reduce, bool overlap);
  Record& acquire(int chunk);
  int tag(ActionKind kind, int micro_batch, int sender_stage) const;

  PipelineChunks& model_;
  Communicator* pp_;
  Profiler& prof_;
  int p_, v_, m_, B_, T_;
  bool split_;
  Arena buffers_, scratch_;                 // on the model's device
  std::vector<int32_t> tokens_, targets_;   // a GPU model's micro-batch, filled on the host, then copied
  std::vector<std::vector<std::unique_ptr<Record>>> pool_;  // per chunk
  Plan train_, eval_;
  ComputeStretch stretch_;
  int eval_n_ = -1;
};

}  // namespace mt
