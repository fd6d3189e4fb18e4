#include "train/train_step.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/device.h"
#include "core/errors.h"
#include "train/checkpoint.h"

namespace mt {

namespace {

// Collective over `group`: whether `flag` is true on any of its ranks.
// The flag travels on `dev`, the group's device: an NCCL group takes device tensors only.
bool any_rank(bool flag, Communicator& group, Device dev) {
  Tensor host = Tensor::zeros({1}, DType::F32);
  host.data_as<float>()[0] = flag ? 1.0f : 0.0f;
  Tensor t = Tensor::empty({1}, DType::F32, dev);
  copy_convert(t, host);
  group.all_reduce(t, ReduceOp::Max);
  return read_scalar(t) > 0;
}

// The loss lives on the last stage, complete on each of its tp ranks: one of them contributes it.
bool loss_rank(const DeviceMesh& mesh) { return mesh.is_last_stage() && mesh.tp_rank() == 0; }

// The summed token losses of the whole global batch, the same on every rank.
double global_loss_sum(TrainingRun& r) {
  float total = loss_rank(r.mesh) ? float(read_scalar(r.loss_sum)) : 0.0f;
  if (r.mesh.world_size() > 1) {
    Tensor t(&total, {1}, DType::F32);
    r.comms.world->all_reduce(t, ReduceOp::Sum);
  }
  return double(total);
}

// The gradients of step 1 into run.dump_grads (parity tests).
void dump_gradients(TrainingRun& r) {
  if (!r.zero) return export_run_safetensors(r, r.cfg.run.dump_grads, r.model->grads());
  if (r.mesh.rank() == 0)
    spdlog::warn("run.dump_grads: skipped under ZeRO-{} (no rank holds the whole reduced gradient)", r.cfg.optim.zero);
}

// optim.staleness: this step's gradients start their average in the background, and the averages that are due or
// ready update the weights, each with the learning rate of the step that computed it. A non-finite average is
// skipped on every replica alike (each applies the same averages), since replicas at different steps could not
// stop together. At a sync point (an evaluation, a checkpoint, the last step) every average still in flight is
// applied, so the replicas hold the same weights there.
void stale_step(TrainingRun& r, int step, bool sync_point, Profiler& prof, StepResult& out) {
  PipelineChunks& model = *r.model;
  out.local_loss_sum = read_scalar(r.loss_sum);
  out.loss = std::nan("");  // known once every rank's figures arrive
  r.stale->issue(step, model.grads());
  double age_max = 0, age_sum = 0;
  const double w0 = trace_clock_us();
  auto apply = [&](int64_t k, const Tensor& avg) {
    const double age = double(step - k);
    age_max = std::max(age_max, age);
    age_sum += age;
    const double o0 = trace_clock_us();
    const bool ok = r.opt->step(model.params(), avg, r.sched.at(int(k)));
    prof.compute("optimizer", o0, trace_clock_us());
    out.applied = out.applied || ok;
    if (ok) {
      r.last_grad_norm = r.opt->last_grad_norm();
    } else {
      ++r.nonfinite_skipped;
      if (r.mesh.rank() == 0)
        spdlog::warn("step {}: the gradient average of step {} has a non-finite norm: skipped on every replica", step,
                     k);
    }
  };
  const int n = sync_point ? r.stale->finish(apply) : r.stale->apply_ready(step, apply);
  prof.wait("stale gradient averages", w0, trace_clock_us());
  out.staleness_max = age_max;
  out.staleness_mean = n > 0 ? age_sum / n : 0.0;
}

}  // namespace

StepResult train_step(TrainingRun& r, int step, bool sync_point, Profiler& prof) {
  const Config& cfg = r.cfg;
  const DeviceMesh& mesh = r.mesh;
  PipelineChunks& model = *r.model;
  const int world = mesh.world_size();
  StepResult out;
  if (model.grads().defined()) zero_(model.grads());
  for (auto& s : r.dp_reduce.sharded)
    if (s) s->zero();
  zero_(r.loss_sum);
  if (step == r.hooks.grad_inf_step && mesh.rank() == world - 1) inject_grad_inf(model);
  if (r.straggler.delay_ms > 0) {
    const double d0 = trace_clock_us();
    sleep_ms(straggler_delay_ms(r.straggler.delay_ms, r.straggler.delay_sigma, cfg.train.seed, mesh.rank(), step));
    prof.compute("straggler delay", d0, trace_clock_us());
  }
  out.loss_scale = r.scaler.scale();
  // Each rank's share of the mean: its tokens' gradients scaled by 1 / (its tokens); dp averages them.
  const double dloss = 1.0 / (double(r.local_batch) * r.T);
  out.pipeline = r.runner->train(
      [&](int m, int32_t* tok, int32_t* tgt) {
        r.train_batches->fill(step - 1, int64_t(mesh.dp_rank()) * r.local_batch + int64_t(m) * r.mb, r.mb, tok, tgt);
      },
      dloss * out.loss_scale, r.loss_sum, r.dp_reduce.hooks, cfg.comm.overlap);
  if (mesh.rank() == world - 1) maybe_fault(r.hooks, step);
  if (step == r.hooks.loss_nan_step && loss_rank(mesh) && mesh.dp_rank() == mesh.dp() - 1) {
    float nan = std::numeric_limits<float>::quiet_NaN();
    copy_convert(r.loss_sum, Tensor(&nan, {1}, DType::F32));
  }
  if (r.stale) {
    out.lr = r.sched.at(step);
    stale_step(r, step, sync_point, prof, out);
    return out;
  }
  if (r.tied >= 0) {
    // Sum the tied embedding's gradient between the first stage (embedding) and the last (head).
    const double w0 = trace_clock_us();
    r.comms.emb->all_reduce(model.chunk(r.tied).grad(model.tied_param()), ReduceOp::Sum);
    prof.wait("tied embedding", w0, trace_clock_us());
  }
  if (reduces(r.dp_reduce)) {
    const double w0 = trace_clock_us();
    finish_reductions(r.dp_reduce);
    prof.wait("gradient buckets", w0, trace_clock_us());
  }
  if (step == 1 && !cfg.run.dump_grads.empty()) dump_gradients(r);

  out.lr = r.sched.at(step);
  out.loss = global_loss_sum(r) / double(r.tokens_per_step);
  out.finite_loss = std::isfinite(out.loss);
  const double o0 = trace_clock_us();
  // Under ZeRO-1 its segments are this rank's shards. A non-finite loss or gradient norm (each the same on every
  // rank) leaves everything unchanged: in fp16 a gradient overflow makes the loss scaler back off and the step
  // count as skipped; otherwise train.skip_nonfinite skips and counts the step, or the run stops.
  const Tensor& grads = r.sharded_grads ? r.dp_reduce.shard_grads : model.grads();
  out.applied = out.finite_loss && r.opt->step(model.params(), grads, out.lr, out.loss_scale);
  prof.compute("optimizer", o0, trace_clock_us());
  const bool overflow = r.fp16 && out.finite_loss && !out.applied;
  if (r.fp16 && (out.applied || overflow) && r.scaler.update(overflow) && mesh.rank() == 0)
    spdlog::warn("step {}: gradient overflow (non-finite norm) at loss scale {:g}: step skipped, scale now {:g}", step,
                 out.loss_scale, r.scaler.scale());
  // Under local SGD each replica has its own gradient norm (the loss is global): without skip_nonfinite the run
  // stops when any replica's norm is non-finite, so that no replica waits alone in the next parameter average.
  const bool nonfinite = !out.applied && !overflow;
  const bool stop = !cfg.train.skip_nonfinite &&
                    (r.local_sgd && mesh.dp() > 1 ? any_rank(nonfinite, *r.comms.dp, r.dev) : nonfinite);
  if (stop || nonfinite) {
    const std::string what = !out.finite_loss ? fmt::format("the loss became non-finite ({})", out.loss)
                             : nonfinite      ? std::string("the gradient norm became non-finite")
                                              : std::string("another replica's gradient norm became non-finite");
    if (stop) {
      const std::string kept = latest_checkpoint(r.ckpt_root);
      out.stop = fmt::format("{} at step {} ({} compute); {}", what, step, dtype_name(r.compute),
                             kept.empty() ? "no checkpoint was written" : "the newest checkpoint is kept: " + kept);
      return out;
    }
    ++r.nonfinite_skipped;
    if (mesh.rank() == 0) spdlog::warn("step {}: {}: step skipped (train.skip_nonfinite)", step, what);
  }
  if (r.local && r.local->due(step, cfg.train.steps)) {
    const double s0 = trace_clock_us();
    r.local->sync(step, model.params(), *r.opt);
    out.synced = true;
    prof.wait("local SGD parameter average", s0, trace_clock_us());
  }
  // ZeRO: the updated shards are gathered while the next step's forward passes run (param_gather.h).
  if (r.zero && out.applied) launch_param_gathers(r.dp_reduce, model);
  return out;
}

double evaluate(TrainingRun& r) {
  wait_param_gathers(r.dp_reduce);
  const int batches = r.cfg.train.eval_batches;
  zero_(r.loss_sum);
  for (int b = 0; b < batches; ++b)  // a batch per run: receive buffers for m micro-batches
    r.runner->forward_only(r.n_micro, [&](int j, int32_t* tok, int32_t* tgt) {
      r.val_batches->fill(b, int64_t(r.mesh.dp_rank()) * r.local_batch + int64_t(j) * r.mb, r.mb, tok, tgt);
    }, r.loss_sum);
  return global_loss_sum(r) / (double(batches) * r.tokens_per_step);
}

}  // namespace mt
