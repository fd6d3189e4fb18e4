// The memory model (see memory_model.h). Every term is the size of a tensor the trainer allocates, rounded as
// Tensor::empty (owning) or Arena::alloc (records, buffers, scratch) round, so the prediction is exact wherever
// the trainer's allocations follow the config alone.
#include "plan/memory_model.h"

#include <algorithm>

#include "comm/communicator.h"
#include "model/pipeline_chunks.h"
#include "parallel/grad_buckets.h"
#include "parallel/sharded_params.h"
#include "plan/activation_bytes.h"
#include "plan/null_communicator.h"
#include "plan/schedule_usage.h"
#include "train/grad_reducers.h"
#include "train/model_config.h"
#include "train/stop_signal.h"

namespace mt::plan {

namespace {
// What a GradReducer with an error-feedback compressor (int8, topk, powersgd) allocates for one chunk: its
// residual and each bucket's compressor state and buffers. Their sizes follow each method's internals
// (parallel/grad_compress*.cpp), so rather than mirror them the planner builds the reducer over a scratch
// gradient buffer and a do-nothing communicator of dp ranks, and counts the host tensor bytes it took.
int64_t compressed_reducer_bytes(const Config& cfg, int dp, const ParamTable& table, const std::vector<Bucket>& b) {
  Tensor grads = Tensor::zeros({std::max<int64_t>(1, table.total_numel())}, DType::F32);
  NullCommunicator null(dp, 0);
  const size_t before = host_tensor_bytes();
  GradReducer reducer(null, grads, b, false, DType::F32, table, compress_options(cfg));
  return int64_t(host_tensor_bytes() - before);
}

// The one-element tensors alive while a rank trains: the optimizer's four scalars, the loss sum, the ring of
// run.stop_signals' votes (stop_vote_lag + 1 of them: trainer.cpp's arm_stop_signals) and, under local SGD, the
// two of a one-number collective (train_step.cpp's reduce_scalar): the replica's loss over pp every step, the
// replicas' finiteness vote over dp at each average. The step's global loss and the step report's timings are views
// of host values.
int small_tensors(const Config& cfg, int dp) {
  std::vector<int> signals;
  std::string bad;
  parse_stop_signals(cfg.run.stop_signals, signals, bad);  // validated with the config
  const bool local_sgd = cfg.optim.sync_every > 0;
  const int votes = !signals.empty() ? stop_vote_lag(cfg.optim.sync_every, cfg.optim.staleness) + 1 : 0;
  return 4 + 1 + votes + (local_sgd && (dp > 1 || cfg.parallel.pp > 1) ? 2 : 0);
}
}  // namespace

MemoryPrediction predict_memory(const Config& cfg, int world) {
  const int dp = resolved_dp(cfg, world), tp = cfg.parallel.tp, pp = cfg.parallel.pp, cp = cfg.parallel.cp;
  // Under context parallelism a rank holds T / cp tokens of each sequence, and the gradients are averaged (and ZeRO
  // shards) over the dp x cp replicas.
  const int v = cfg.parallel.virtual_stages, B = cfg.train.micro_batch, T = cfg.model.seq_len / cp;
  const int m = cfg.train.global_batch / (dp * B), replicas = dp * cp;
  const std::vector<int> layers = layers_per_stage(cfg);
  const GPTConfig base = gpt_config(cfg);
  const TensorSharding sharding{tp, 0, cfg.parallel.sequence_parallel};
  const DType dt = cfg.precision.compute;
  const bool mixed = dt != DType::F32, zero = cfg.optim.zero >= 1, zero3 = cfg.optim.zero == 3;
  const bool split = cfg.parallel.schedule == PipelineSchedule::ZB1;
  const bool local_sgd = cfg.optim.sync_every > 0;  // no gradient buckets: parameters are averaged instead
  const bool reducers = (replicas > 1 || zero) && !local_sgd;
  const bool wire16 = cfg.precision.grad_reduce != DType::F32 || cfg.comm.compress == CompressMethod::BF16;
  const bool feedback = compress_with_feedback(cfg.comm.compress);

  MemoryPrediction out;
  for (int r = 0; r < pp; ++r) {
    StageMemory s;
    s.pp_rank = r;
    const ParamTable rank_table = PipelineChunks::rank_table(base, sharding, layers, pp, r);
    const int64_t n = std::max<int64_t>(1, rank_table.total_numel());
    // ZeRO-3 has no flat parameter buffer: its parameters are counted per chunk below (data_parallel.cpp's
    // FullySharded).
    s.params = zero3 ? 0.0 : double(tensor_bytes(n, dt));
    // ZeRO-2 (reducing every micro-batch) and ZeRO-3: no flat gradient buffer, but each chunk's unit buffers (and
    // their 16-bit wire copies) and one buffer of the rank's packed gradient shards (grad_reducers.cpp).
    const bool sharded = reducers && sharded_gradients(cfg);
    s.grads = sharded ? 0.0 : double(tensor_bytes(n, DType::F32));
    int64_t state = n, grad_shards = 0;
    if (zero) state = 0;
    const ScheduleUsage use = schedule_usage(cfg.parallel.schedule, pp, m, v, r);
    const ShardedGradsOptions ring = sharded_grads_options(cfg, dp, dt, DType::F32);
    for (int c = 0; c < v; ++c) {
      const StageConfig g = stage_config(base, tp, sharding.sequence_parallel, layers, c * pp + r);
      const ParamTable table = gpt_param_table(g.model, g.part);
      if (sharded) {
        const std::vector<GradUnit> units = chunk_grad_units(cfg, base, table);
        const std::vector<Bucket> buckets =
            unit_buckets(table, units, dtype_size(DType::F32), cfg.comm.bucket_mb * 1048576.0);
        const ShardedGradsSize z = sharded_grads_size(units, buckets, replicas, 0, ring, wire16);
        s.grads += double(tensor_bytes(std::max<int64_t>(1, z.store), DType::F32));
        if (z.staging) s.grads += double(tensor_bytes(z.staging, DType::F32));
        if (wire16) s.dp_state += double(tensor_bytes(std::max<int64_t>(1, z.store), DType::BF16));
        state += z.shard;
        grad_shards += z.shard;
        // ZeRO-3: the chunk's ShardedParams unit buffers (two ring slots unless it shares the gradients', and the
        // pinned units') in the compute dtype; its parameter shards are packed with the other chunks' (below).
        if (zero3)
          s.params += double(tensor_bytes(
              std::max<int64_t>(1, sharded_params_store_numel(chunk_param_units(cfg, base, table), ring.shared_ring)),
              dt));
      } else if (reducers) {
        const std::vector<Bucket> buckets =
            chunk_buckets(cfg, table, dtype_size(DType::F32), tied_copy_param(cfg, base, table));
        if (zero)
          for (const Bucket& b : buckets) state += shard_range(b.numel(), replicas, 0).size();
        if (feedback) s.dp_state += double(compressed_reducer_bytes(cfg, replicas, table, buckets));
        else if (wire16) s.dp_state += double(tensor_bytes(table.total_numel(), DType::BF16));
      }
      s.activations += double(use.records[c]) * double(record_bytes(g, B, T, dt, split, cp));
      s.records += use.records[c];
      // Under context parallelism a block's attention allocates the ring's temporaries per call, while the scratch
      // is held (tensors of their own: Tensor::empty).
      s.scratch = std::max(s.scratch, double(backward_scratch_bytes(g, B, T, dt, split, cp, ring.shared_ring) +
                                             attention_temp_bytes(g, B, T, dt, cp)));
    }
    if (sharded) s.grads += double(tensor_bytes(std::max<int64_t>(1, grad_shards), DType::F32));
    // ZeRO-3's parameter shards: one packed buffer in the compute dtype, cut as the gradient shards.
    if (zero3) s.params += double(tensor_bytes(std::max<int64_t>(1, grad_shards), dt));
    state = std::max<int64_t>(1, state);
    s.optimizer = double((mixed ? 3 : 2) * tensor_bytes(state, DType::F32));
    const double one = double(tensor_bytes(1, DType::F32));
    s.small = small_tensors(cfg, replicas) * one;
    // With 16-bit compute the full fp32 masters exist while the optimizer (and the reducers before it) is built.
    // ZeRO-3, in any dtype, holds such a whole fp32 buffer only for a loaded model (model.init_from); a new one is
    // drawn after the optimizer exists, one parameter at a time, into that parameter's fp32 gradient buffer
    // (training_run.cpp's init_sharded): nothing beyond the state.
    const double state_then = s.params + s.grads + s.dp_state + s.optimizer + 4 * one;
    if (zero3)
      s.setup = state_then + (cfg.model.init_from.empty() ? 0.0 : double(tensor_bytes(n, DType::F32)));
    else if (mixed)
      s.setup = state_then + double(tensor_bytes(n, DType::F32));
    if (local_sgd) {
      // LocalSGD: the fp32 staging copy of the masters (16-bit compute), the anchor and the outer momentum
      // (Nesterov).
      if (mixed) s.dp_state += double(tensor_bytes(n, DType::F32));
      if (cfg.optim.outer == OuterOptimizer::Nesterov) s.dp_state += 2 * double(tensor_bytes(n, DType::F32));
    }
    const int recvs = use.recv_actions + (cfg.train.eval_every > 0 ? use.eval_recvs : 0);
    s.buffers = double(recvs) * double(recv_buffer_bytes({base, {BlockSlice{}, sharding}}, B, T, dt));
    out.stages.push_back(s);
    if (s.peak() > out.peak) {
      out.peak = s.peak();
      out.worst_stage = r;
    }
  }
  return out;
}

}  // namespace mt::plan
