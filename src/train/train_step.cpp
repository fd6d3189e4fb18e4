#include "train/train_step.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "comm/flight_recorder.h"
#include "core/device.h"
#include "core/errors.h"
#include "model/ring_attention.h"
#include "train/checkpoint.h"

namespace mt {

namespace {

// Collective over `group`: `value` reduced with `op` over its ranks. It travels on `dev`, the group's device: an
// NCCL group takes device tensors only.
float reduce_scalar(float value, Communicator& group, Device dev, ReduceOp op) {
  Tensor host = Tensor::zeros({1}, DType::F32);
  host.data_as<float>()[0] = value;
  Tensor t = Tensor::empty({1}, DType::F32, dev);
  copy_convert(t, host);
  group.all_reduce(t, op);
  return float(read_scalar(t));
}

// Micro-batch `m` of this dp rank's share of batch `index` into tok / tgt [mb, T_rank]: with context parallelism,
// this rank's two zigzag chunks of each sequence (model/ring_attention.h).
void fill_micro_batch(TrainingRun& r, Batcher& batches, int64_t index, int m, int32_t* tok, int32_t* tgt) {
  const int64_t first = int64_t(r.mesh.dp_rank()) * r.local_batch + int64_t(m) * r.mb;
  if (r.mesh.cp() == 1) return batches.fill(index, first, r.mb, tok, tgt);
  Tensor full_tok = Tensor::empty({r.mb, r.T}, DType::I32), full_tgt = Tensor::empty({r.mb, r.T}, DType::I32);
  batches.fill(index, first, r.mb, full_tok.data_as<int32_t>(), full_tgt.data_as<int32_t>());
  zigzag_shard(Tensor(tok, {r.mb, r.T_rank}, DType::I32), full_tok, r.mesh.cp(), r.mesh.cp_rank());
  zigzag_shard(Tensor(tgt, {r.mb, r.T_rank}, DType::I32), full_tgt, r.mesh.cp(), r.mesh.cp_rank());
}

// The loss lives on the last stage, complete on each of its tp ranks: one of them contributes it.
bool loss_rank(const DeviceMesh& mesh) { return mesh.is_last_stage() && mesh.tp_rank() == 0; }

// The summed token losses of the whole global batch, the same on every rank.
// step: the training step (its fault hooks), or -1 (evaluation).
double global_loss_sum(TrainingRun& r, int step) {
  float total[2] = {loss_rank(r.mesh) ? float(read_scalar(r.loss_sum)) : 0.0f, 0.0f};
  if (r.mesh.world_size() > 1) {
    FlightSite site("loss");
    // MESHTRAIN_FAULT=skip / size / reduce (test_hooks.h): the last rank leaves the ranks out of step here.
    const bool faulty = r.mesh.rank() == r.mesh.world_size() - 1 && step > 0;
    if (faulty && step == r.hooks.skip_step) return double(total[0]);
    Tensor t(total, {faulty && step == r.hooks.size_step ? 2 : 1}, DType::F32);
    r.comms.world->all_reduce(t, faulty && step == r.hooks.reduce_step ? ReduceOp::Max : ReduceOp::Sum);
  }
  return double(total[0]);
}

// Local SGD: the summed token losses of this rank's replica, the same on each of its ranks (the replicas meet only
// at their averages). Each pipeline's last stage has them, on each tp rank.
double replica_loss_sum(TrainingRun& r) {
  const float here = r.mesh.is_last_stage() ? float(read_scalar(r.loss_sum)) : 0.0f;
  if (r.mesh.pp() == 1) return here;
  FlightSite site("replica loss");
  return reduce_scalar(here, *r.comms.pp, r.dev, ReduceOp::Sum);
}

std::string stop_message(const TrainingRun& r, const std::string& what, int step) {
  const std::string kept = latest_checkpoint(r.ckpt_root);
  return fmt::format("{} at step {} ({} compute); {}", what, step, dtype_name(r.compute),
                     kept.empty() ? "no checkpoint was written" : "the newest checkpoint is kept: " + kept);
}

}  // namespace

StepResult train_step(TrainingRun& r, int step, bool sync_point, Profiler& prof) {
  const Config& cfg = r.cfg;
  const DeviceMesh& mesh = r.mesh;
  PipelineChunks& model = *r.model;
  const int world = mesh.world_size();
  StepResult out;
  flight_where().step = step;
  r.dp->begin_step(model);
  zero_(r.loss_sum);
  if (step == r.hooks.grad_inf_step && mesh.rank() == world - 1) inject_grad_inf(model);
  if (r.straggler.delay_ms > 0) {
    const double d0 = trace_clock_us();
    sleep_ms(straggler_delay_ms(r.straggler.delay_ms, r.straggler.delay_sigma, cfg.train.seed, mesh.rank(), step));
    prof.compute("straggler delay", d0, trace_clock_us());
  }
  out.loss_scale = r.scaler.scale();
  // Each rank's share of the mean: its tokens' gradients scaled by 1 / (its tokens); the replica group (dp x cp)
  // averages them.
  const double dloss = 1.0 / (double(r.local_batch) * r.T_rank);
  out.pipeline = r.runner->train(
      [&](int m, int32_t* tok, int32_t* tgt) { fill_micro_batch(r, *r.train_batches, step - 1, m, tok, tgt); },
      dloss * out.loss_scale, r.loss_sum, r.dp->hooks(), cfg.comm.overlap);
  if (mesh.rank() == world - 1) maybe_fault(r.hooks, step);
  if (step == r.hooks.loss_nan_step && loss_rank(mesh) && mesh.dp_rank() == mesh.dp() - 1) {
    float nan = std::numeric_limits<float>::quiet_NaN();
    copy_convert(r.loss_sum, Tensor(&nan, {1}, DType::F32));
  }
  if (r.tied >= 0) {
    // Sum the tied embedding's gradient between the first stage (embedding) and the last (head).
    const double w0 = trace_clock_us();
    FlightSite site("tied embedding");
    r.comms.emb->all_reduce(model.chunk(r.tied).grad(model.tied_param()), ReduceOp::Sum);
    prof.wait("tied embedding", w0, trace_clock_us());
  }
  r.dp->update(r, step, sync_point, prof, out);
  if (step == r.hooks.drift_step && mesh.rank() == world - 1) {
    r.dp->wait_params();  // not under a ZeRO gather still writing the weights
    inject_weight_drift(model);
  }
  return out;
}

void optimizer_update(TrainingRun& r, int step, const Tensor& grads, bool replica_alone, Profiler& prof,
                      StepResult& out) {
  const DeviceMesh& mesh = r.mesh;
  out.lr = r.sched.at(step);
  if (replica_alone) {
    const double replica = replica_loss_sum(r);
    out.loss = replica / double(r.tokens_per_step / mesh.dp());
    out.local_loss_sum = loss_rank(mesh) ? read_scalar(r.loss_sum) : 0.0;
  } else {
    out.loss = global_loss_sum(r, step) / double(r.tokens_per_step);
  }
  out.finite_loss = std::isfinite(out.loss);
  const double o0 = trace_clock_us();
  // Under ZeRO the segments are this rank's shards. A non-finite loss or gradient norm (each the same on every
  // rank of the replica) leaves everything unchanged: in fp16 a gradient overflow makes the loss scaler back off
  // and the step count as skipped; otherwise train.skip_nonfinite skips and counts the step, or the run stops.
  out.applied = out.finite_loss && r.opt->step(r.dp->optimizer_params(*r.model), grads, out.lr, out.loss_scale);
  prof.compute("optimizer", o0, trace_clock_us());
  out.grad_norm = out.finite_loss ? r.opt->last_grad_norm() : std::nan("");
  const bool overflow = r.fp16 && out.finite_loss && !out.applied;
  if (r.fp16 && (out.applied || overflow) && r.scaler.update(overflow) && mesh.rank() == 0)
    spdlog::warn("step {}: gradient overflow (non-finite norm) at loss scale {:g}: step skipped, scale now {:g}", step,
                 out.loss_scale, r.scaler.scale());
  if (out.applied || overflow) return;
  const std::string what = !out.finite_loss ? fmt::format("the loss became non-finite ({})", out.loss)
                                            : std::string("the gradient norm became non-finite");
  if (!r.cfg.train.skip_nonfinite) {
    // Alone, the replica goes on without this step until the next average, where they all stop.
    if (replica_alone) out.nonfinite = what;
    else out.stop = stop_message(r, what, step);
    return;
  }
  ++r.nonfinite_skipped;
  if (mesh.rank() == 0) spdlog::warn("step {}: {}: step skipped (train.skip_nonfinite)", step, what);
}

void stop_if_a_replica_was_nonfinite(TrainingRun& r, int step, int first, const std::string& what,
                                     StepResult& out) {
  // The earliest such step of any replica, as the largest of -step (none: below every step).
  constexpr float kNone = -1e9f;
  float earliest = first > 0 ? -float(first) : kNone;
  if (r.mesh.dp() > 1) {
    FlightSite site("replicas non-finite");
    earliest = reduce_scalar(earliest, *r.comms.dp, r.dev, ReduceOp::Max);
  }
  if (earliest == kNone) return;
  const int at = int(-earliest);
  const std::string msg = stop_message(r, first == at ? what : "another replica's loss or gradient norm became "
                                                               "non-finite", at);
  out.stop = step == at ? msg : fmt::format("{}; the replicas stopped at their parameter average of step {}", msg, step);
}

double evaluate(TrainingRun& r) {
  r.dp->wait_params();
  const int batches = r.cfg.train.eval_batches;
  zero_(r.loss_sum);
  for (int b = 0; b < batches; ++b)  // a batch per run: receive buffers for m micro-batches
    r.runner->forward_only(r.n_micro, [&](int j, int32_t* tok, int32_t* tgt) {
      fill_micro_batch(r, *r.val_batches, b, j, tok, tgt);
    }, r.loss_sum, r.dp->hooks());
  return global_loss_sum(r, -1) / (double(batches) * r.tokens_per_step);
}

}  // namespace mt
