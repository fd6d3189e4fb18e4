// The data-parallel strategies (data_parallel.h).
#include "train/data_parallel.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <sstream>

#include "core/device.h"
#include "optim/local_sgd.h"
#include "parallel/sharded_params.h"
#include "parallel/stale_gradients.h"
#include "train/comm_adapt.h"
#include "train/compress_checkpoint.h"
#include "train/grad_reducers.h"
#include "train/metrics.h"
#include "train/resume.h"
#include "train/sync_period_adapt.h"
#include "train/train_step.h"
#include "train/training_run.h"
#include "train/zero_shards.h"

namespace mt {

namespace {

// A local SGD checkpoint's name for replica d's optimizer field `what` (replica 0's has the plain name).
std::string replica_kind(int d, const char* what) { return d == 0 ? what : fmt::format("replica{}/{}", d, what); }

}  // namespace

std::vector<OptimSegment> DataParallel::optimizer_segments(const PipelineChunks& model, int64_t& state_numel,
                                                           OptimizerSettings&) const {
  state_numel = model.table().total_numel();
  return param_segments(model.table());
}

void DataParallel::begin_step(PipelineChunks& model) { zero_(model.grads()); }

void DataParallel::set_weights(PipelineChunks& model, const Tensor& part, int64_t offset) {
  copy_convert(model.params().slice(offset, {part.numel()}), part);
}

void DataParallel::restore_from(TrainingRun& r, const CheckpointInfo& info) {
  if (r.mesh.rank() == 0 && checkpoint_has(info, replica_kind(1, kExpAvgKind)))
    spdlog::info("the checkpoint was written under local SGD, whose replicas each kept their own optimizer moments: "
                 "this run takes replica 0's");
}

std::string DataParallel::memory_note(bool mixed) const { return mixed ? " (AdamW moments and fp32 masters)" : ""; }

namespace {

// The gradients of step 1 into run.dump_grads (parity tests): the whole reduced gradient, which no rank holds
// under ZeRO.
void dump_gradients(TrainingRun& r, bool sharded) {
  if (!sharded) return export_run_safetensors(r, r.cfg.run.dump_grads, r.model->grads());
  if (r.mesh.rank() == 0)
    spdlog::warn("run.dump_grads: skipped under ZeRO-{} (no rank holds the whole reduced gradient)", r.cfg.optim.zero);
}

// Every step's gradients averaged before the optimizer (ZeRO-0, -1, -2), or one replica's own.
class Synchronous : public DataParallel {
 public:
  Synchronous(const Config& cfg, const DeviceMesh& mesh, MeshComms& comms, PipelineChunks& model, bool on_demand,
              bool log)
      : cfg_(cfg), mesh_(mesh), comms_(comms), model_(model), zero_on_(cfg.optim.zero >= 1),
        sharded_grads_(sharded_gradients(cfg)) {
    use_reducers(make_grad_reducers(cfg, model, *comms.dp, mesh.replicas(), log, comms.dp_host.get()));
    for (int c = 0; c < model.size(); ++c)  // ZeRO-2: the backward passes accumulate into the unit buffers
      if (red_.sharded[c]) model.chunk(c).set_grad_views(red_.sharded[c]->grad_views());
    if (on_demand)
      for (auto& g : red_.gathers)
        if (g) g->set_on_demand();
  }
  ~Synchronous() override {
    for (int c = 0; c < model_.size(); ++c) model_.chunk(c).set_param_read_hook({});  // they point into this
  }

  std::vector<OptimSegment> optimizer_segments(const PipelineChunks& model, int64_t& state_numel,
                                               OptimizerSettings& os) const override {
    if (!zero_on_) return DataParallel::optimizer_segments(model, state_numel, os);
    // Under ZeRO-2 the shards' gradients are packed like the moments, chunk v-1's first (ChunkReducers).
    os.packed_grads = sharded_grads_;
    std::vector<OptimSegment> segments;
    state_numel = 0;
    for (int c = model.size() - 1; c >= 0; --c) {
      const std::vector<Bucket>& buckets = red_.sharded[c] ? red_.sharded[c]->buckets() : red_.owned[c]->buckets();
      for (OptimSegment g : zero_segments(model.chunk(c).table(), buckets, mesh_.replicas(), mesh_.replica_rank())) {
        g.offset += model.base(c);
        g.state_offset += state_numel;
        segments.push_back(g);
      }
      for (const Bucket& b : buckets) state_numel += shard_range(b.numel(), mesh_.replicas(), mesh_.replica_rank()).size();
    }
    return segments;
  }
  bool shards_optimizer() const override { return zero_on_; }

  void attach(TrainingRun& r) override {
    if (r.cfg.comm.adapt) build_adapt(r.mesh.rank() == 0, {r.cfg.comm.bucket_mb, r.cfg.comm.compress});
  }

  void begin_step(PipelineChunks& model) override {
    if (model.grads().defined()) zero_(model.grads());
    for (auto& s : red_.sharded)
      if (s) s->zero();
  }

  void update(TrainingRun& r, int step, bool, Profiler& prof, StepResult& out) override {
    // ZeRO-1, -2: the forward passes waited for the buckets they read; any other is done before the optimizer
    // writes the shards it gathers from.
    if (zero_on_) wait_param_gathers(red_);
    reduce_and_step(r, step, prof, out);
    // ZeRO: the updated shards are gathered while the next step's forward passes run (param_gather.h).
    if (out.stop.empty() && zero_on_ && out.applied) launch_param_gathers(red_, *r.model);
  }

  bool adapts() const override { return adapt_ != nullptr; }
  void adapt_after_step(TrainingRun& r, int, bool, const AdaptSample& sample, StepMetrics& row) override;

  // Compression's error feedback (every rank's residual, PowerSGD's Qs) and comm.adapt's setting in force.
  void add_to_checkpoint(TrainingRun&, CheckpointShard& shard) override {
    if (adapt_)
      shard.metadata[kAdaptSettingKey] =
          fmt::format("{:.17g} {}", adapt_->setting().bucket_mb, name_of(adapt_->setting().compress));
    add_compression_state(red_, model_, mesh_, shard);
  }
  void restore_from(TrainingRun& r, const CheckpointInfo& info) override;

  void wait_params() override { wait_param_gathers(red_); }
  void gather_shards(const PipelineChunks& model, const Tensor& flat) override {
    if (zero_on_) all_gather_params(red_, model, flat);
  }
  int64_t gradient_bytes(const PipelineChunks& model) const override { return mt::gradient_bytes(red_, model); }
  std::string memory_note(bool mixed) const override {
    if (!zero_on_) return DataParallel::memory_note(mixed);
    return fmt::format(" (ZeRO-{}: this rank's 1/{} shard of the AdamW moments{}{})", cfg_.optim.zero, mesh_.replicas(),
                       mixed ? " and fp32 masters" : "", sharded_grads_ ? " and of the gradients" : "");
  }

 protected:
  // The step's reductions finished, then the optimizer's step.
  void reduce_and_step(TrainingRun& r, int step, Profiler& prof, StepResult& out) {
    if (reduces(red_)) {
      const double w0 = trace_clock_us();
      finish_reductions(red_);
      prof.wait("gradient buckets", w0, trace_clock_us());
    }
    if (step == 1 && !r.cfg.run.dump_grads.empty()) dump_gradients(r, zero_on_);
    optimizer_update(r, step, sharded_grads_ ? red_.shard_grads : r.model->grads(), false, prof, out);
    if (!out.applied) reset_feedback(red_);  // the compression's error feedback (GradReducer::reset_feedback)
  }
  // ZeRO-1 and -2: each parameter read waits for its own bucket of the gather after the optimizer (param_gather.h).
  void use_reducers(ChunkReducers r) {
    red_ = std::move(r);
    hooks_ = red_.hooks;
    for (int c = 0; c < model_.size(); ++c)
      if (red_.hooks[c].gather) model_.chunk(c).set_param_read_hook(red_.gathers[c]->reader(model_.chunk(c).table()));
  }
  // The reducers for a bucket size and compression.
  ChunkReducers reducers_for(const AdaptSetting& s, bool log) const {
    Config c = cfg_;
    c.comm.bucket_mb = s.bucket_mb;
    c.comm.compress = s.compress;
    return make_grad_reducers(c, model_, *comms_.dp, mesh_.replicas(), log, comms_.dp_host.get());
  }
  // comm.adapt: the controller, told how many bytes each allowed compression puts on the wire per gradient byte
  // (measured by building its reducers once, here at the start), starting from `start`.
  void build_adapt(bool log, const AdaptSetting& start);
  // comm.adapt: the setting the checkpoint's run was in, where this run allows it, is where the controller starts
  // again (its measurements start afresh). Every rank reads the same value.
  void resume_adapt_setting(TrainingRun& r, const CheckpointInfo& info);
  static constexpr char kAdaptSettingKey[] = "comm_adapt_setting";  // in the rank files' __metadata__

  const Config& cfg_;
  const DeviceMesh& mesh_;
  MeshComms& comms_;
  PipelineChunks& model_;
  bool zero_on_, sharded_grads_;  // optim.zero >= 1; ZeRO-2 reducing every micro-batch (no flat gradients)
  ChunkReducers red_;
  std::unique_ptr<CommController> adapt_;
};

void Synchronous::build_adapt(bool log, const AdaptSetting& start) {
  const CommConfig& cm = cfg_.comm;
  AdaptLimits limits;
  limits.min_bucket_mb = cm.adapt_bucket_mb_min;
  limits.max_bucket_mb = cm.adapt_bucket_mb_max;
  limits.every = cm.adapt_every;
  std::string bad;
  parse_compress_list(cm.adapt_compress, limits.methods, bad);  // validated
  if (limits.methods.empty()) limits.methods = {cm.compress};
  auto wire = [&](CompressMethod m) {
    int64_t bytes = 0;
    for (const auto& red : reducers_for({cm.bucket_mb, m}, false).owned)
      if (red) bytes += red->wire_bytes_per_step();
    return double(bytes);
  };
  const double plain = wire(CompressMethod::None);
  std::vector<std::pair<CompressMethod, double>> factors;
  for (CompressMethod m : limits.methods) factors.emplace_back(m, wire(m) / plain);
  const double grad_mb = double(mt::gradient_bytes(red_, model_)) / 1048576.0;
  adapt_ = std::make_unique<CommController>(limits, start, grad_mb, factors);
  if (log) {
    std::string methods;
    for (const auto& [m, f] : factors) methods += fmt::format("{}{} ({:.3f} of the bytes)", methods.empty() ? "" : ", ",
                                                              name_of(m), f);
    spdlog::info("comm.adapt: bucket size {:g}..{:g} MiB, compression among {}; a decision every {} steps",
                 limits.min_bucket_mb, limits.max_bucket_mb, methods, limits.every);
  }
}

void Synchronous::restore_from(TrainingRun& r, const CheckpointInfo& info) {
  DataParallel::restore_from(r, info);
  if (adapt_) resume_adapt_setting(r, info);
  const std::string fresh_qs = restore_compression_state(red_, model_, mesh_, info);
  if (r.mesh.rank() != 0) return;
  int held = 0;  // the replicas whose residuals the checkpoint holds
  while (checkpoint_has(info, residual_kind(held))) ++held;
  const bool feedback = red_.owned[0] && red_.owned[0]->residual().defined();
  const char* method = red_.owned[0] ? name_of(red_.owned[0]->compress_method()) : "none";
  if (!feedback) {
    if (held)
      spdlog::info("the checkpoint holds the gradient compression's error feedback of {} replicas, which this run "
                   "does not use ({})", held, red_.owned[0] ? fmt::format("comm.compress={}", method)
                                                            : std::string("it reduces no gradients over dp"));
    return;
  }
  const char* differs = "so the run does not continue as an uninterrupted one would";
  if (!fresh_qs.empty()) spdlog::warn("comm.compress={}: {}, {}", method, fresh_qs, differs);
  if (held == 0)
    spdlog::warn("comm.compress={}: the checkpoint holds no error-feedback residuals (written without int8, topk or "
                 "powersgd): they start from zero", method);
  else if (held < mesh_.replicas())
    spdlog::warn("comm.compress={}: the checkpoint holds the error-feedback residuals of {} replicas: {} from zero, {}",
                 method, held, held + 1 == mesh_.replicas() ? fmt::format("replica {} starts", held)
                                                            : fmt::format("replicas {}-{} start", held,
                                                                          mesh_.replicas() - 1),
                 differs);
  else if (fresh_qs.empty())
    spdlog::info("comm.compress={}: each of the {} replicas resumes its error-feedback residual{}", method,
                 mesh_.replicas(), red_.owned[0]->low_rank_state().empty() ? "" : ", and PowerSGD its Qs");
}

void Synchronous::resume_adapt_setting(TrainingRun& r, const CheckpointInfo& info) {
  const CommConfig& cm = r.cfg.comm;
  const SafetensorsFile* file = nullptr;
  const std::string* value = checkpoint_metadata(info, kAdaptSettingKey, &file);
  if (!value) return;
  std::istringstream in(*value);
  AdaptSetting s;
  std::string method, bad;
  std::vector<CompressMethod> parsed, allowed;
  if (!(in >> s.bucket_mb >> method) || !parse_compress_list(method, parsed, bad) || parsed.size() != 1)
    input_error("checkpoint file {}: bad {} '{}'", file->path(), kAdaptSettingKey, *value);
  s.compress = parsed[0];
  parse_compress_list(cm.adapt_compress, allowed, bad);  // validated
  if (allowed.empty()) allowed = {cm.compress};
  if (s.bucket_mb < cm.adapt_bucket_mb_min || s.bucket_mb > cm.adapt_bucket_mb_max ||
      std::find(allowed.begin(), allowed.end(), s.compress) == allowed.end() || s == adapt_->setting())
    return;
  if (r.mesh.rank() == 0)
    spdlog::info("comm.adapt: resumes at the checkpoint's setting, bucket {:g} MiB and compression {} "
                 "(comm.bucket_mb={}, comm.compress={})", s.bucket_mb, name_of(s.compress), cm.bucket_mb,
                 name_of(cm.compress));
  use_reducers(reducers_for(s, false));
  build_adapt(false, s);
}

// comm.adapt after a step: its row records the setting the step ran with; the controller takes the step's figures,
// and a decision rebuilds the reducers with its bucket size and compression (between steps, when no reduction is
// in flight; a compression's error-feedback state starts again).
void Synchronous::adapt_after_step(TrainingRun& r, int step, bool, const AdaptSample& sample, StepMetrics& row) {
  row.bucket_mb = adapt_->setting().bucket_mb;
  row.compress = name_of(adapt_->setting().compress);
  const std::optional<AdaptDecision> decided = adapt_->observe(step, sample);
  if (!decided) return;
  const AdaptDecision& d = *decided;
  if (!(d.to == d.from)) use_reducers(reducers_for(d.to, false));
  row.adapt = fmt::format("bucket {:g} -> {:g} MiB, compression {} -> {}: {}", d.from.bucket_mb, d.to.bucket_mb,
                          name_of(d.from.compress), name_of(d.to.compress), d.why);
  if (r.mesh.rank() == 0)
    spdlog::info("comm.adapt from step {}: bucket {:g} -> {:g} MiB, compression {} -> {} ({}: link {:.0f} us + {:.0f} "
                 "us/MiB per all-reduce, backward {:.1f} ms, exposed {:.1f} ms; step {:.1f} ms, expected {:.1f} ms)",
                 d.step, d.from.bucket_mb, d.to.bucket_mb, name_of(d.from.compress), name_of(d.to.compress), d.why,
                 d.alpha_us, d.beta_us_per_mb, d.backward_ms, d.exposed_ms, d.step_ms, d.predicted_to_ms);
}

// ZeRO-3: Synchronous's sharded gradients and optimizer, and the parameters sharded too. Each chunk keeps only
// this rank's shards of its compute copy (a ShardedParams, packed like the gradient shards and the moments, so the
// optimizer updates them in place) and gathers each unit as a pass reaches it.
class FullySharded final : public Synchronous {
 public:
  FullySharded(const Config& cfg, const DeviceMesh& mesh, MeshComms& comms, PipelineChunks& model, bool on_demand,
               bool log)
      : Synchronous(cfg, mesh, comms, model, false, log) {
    std::vector<int64_t> at(model.size());
    int64_t numel = 0;
    for (int c = model.size() - 1; c >= 0; --c) {  // packed as the gradient shards: chunk v-1 first
      at[c] = numel;
      numel += red_.sharded[c]->shard_numel();
    }
    shards_ = Tensor::zeros({std::max<int64_t>(1, numel)}, model.dtype(), model.device());
    params_.resize(model.size());
    int64_t buffers = 0;
    for (int c = 0; c < model.size(); ++c) {
      GPT& chunk = model.chunk(c);
      params_[c] = std::make_unique<ShardedParams>(
          *comms.dp, chunk.table(), chunk_param_units(cfg, chunk.config(), chunk.table()),
          red_.sharded[c]->buckets(), model.dtype(), model.device(),
          shards_.slice(at[c], {red_.sharded[c]->shard_numel()}), red_.sharded[c]->ring_slots());
      if (on_demand) params_[c]->set_on_demand();
      if (cfg.optim.zero_unit == ZeroUnit::Sublayer) params_[c]->set_read_driven();
      chunk.set_param_views(params_[c]->param_views());
      chunk.set_param_read_hook(params_[c]->reader());
      chunk.set_grads_over_params(red_.sharded[c]->ring_slots().defined());
      hooks_[c].params = params_[c].get();
      buffers += params_[c]->buffer_bytes();
    }
    if (log)
      spdlog::info("data parallel: ZeRO-3, parameters {} ({:.2f} MiB of this rank's shards, {:.2f} MiB of gathered "
                   "units' buffers{})",
                   reshards_after_forward(cfg)
                       ? "gathered unit by unit before each forward and backward pass, the next unit prefetched"
                       : fmt::format("gathered unit by unit in the step's first pass and kept to its end "
                                     "(parallel.reshard_after_forward={}{})",
                                     name_of(cfg.parallel.reshard_after_forward),
                                     cfg.parallel.pp > 1 ? " with pipeline parallelism" : ""),
                   shards_.nbytes() / 1048576.0, buffers / 1048576.0,
                   red_.sharded[0]->ring_slots().defined()
                       ? ", and two ring slots shared with the gradients, written over the parameters" : "");
  }

  std::vector<OptimSegment> optimizer_segments(const PipelineChunks& model, int64_t& state_numel,
                                               OptimizerSettings& os) const override {
    os.packed_params = true;
    return Synchronous::optimizer_segments(model, state_numel, os);
  }
  bool shards_parameters() const override { return true; }
  Tensor optimizer_params(const PipelineChunks&) const override { return shards_; }
  void set_weights(PipelineChunks& model, const Tensor& part, int64_t offset) override {
    for (int c = 0; c < model.size(); ++c) {
      const int64_t lo = std::max(offset, model.base(c)),
                    hi = std::min(offset + part.numel(), model.base(c) + model.chunk(c).table().total_numel());
      if (lo < hi) params_[c]->load_shards(part.slice(lo - offset, {hi - lo}), lo - model.base(c));
    }
  }

  void update(TrainingRun& r, int step, bool, Profiler& prof, StepResult& out) override {
    reduce_and_step(r, step, prof, out);
    for (auto& p : params_) p->begin_step();  // the shards changed: the next pass gathers every unit again
    // The next step's first forward pass (chunk 0's) starts with its first units' gathers already in flight.
    params_[0]->prefetch_forward_start();
  }
  void wait_params() override {}
  int64_t parameter_bytes(const PipelineChunks&) const override {
    int64_t bytes = int64_t(shards_.nbytes());
    for (const auto& p : params_) bytes += p->buffer_bytes();
    return bytes;
  }
  std::string memory_note(bool mixed) const override {
    return fmt::format(" (ZeRO-3: this rank's 1/{} shard of the parameters, gradients and AdamW moments{}, and "
                       "the gathered units' buffers)", mesh_.replicas(), mixed ? " and fp32 masters" : "");
  }

 private:
  Tensor shards_;  // this rank's parameter shards of every chunk, packed chunk v-1 first
  std::vector<std::unique_ptr<ShardedParams>> params_;  // per chunk
};

// Local SGD: the replicas step alone and average their parameters every optim.sync_every steps.
class LocalSgdStrategy final : public DataParallel {
 public:
  explicit LocalSgdStrategy(int chunks) { hooks_.resize(chunks); }

  void attach(TrainingRun& r) override {
    const Config& cfg = r.cfg;
    LocalSGDSettings ls;
    ls.sync_every = cfg.optim.sync_every;
    ls.nesterov = cfg.optim.outer == OuterOptimizer::Nesterov;
    ls.outer_lr = cfg.optim.outer_lr;
    ls.outer_momentum = cfg.optim.outer_momentum;
    local_ = std::make_unique<LocalSGD>(ls, *r.comms.dp, r.model->params(), *r.opt);
    const bool rank0 = r.mesh.rank() == 0;
    if (rank0)
      spdlog::info("local SGD: {} replicas step alone and average their parameters every {} steps ({}); outer "
                   "state {:.1f} MiB",
                   r.mesh.dp(), ls.sync_every,
                   ls.nesterov ? fmt::format("outer Nesterov SGD, lr {:g}, momentum {:g}", ls.outer_lr,
                                             ls.outer_momentum)
                               : "plain average",
                   local_->state_bytes() / 1048576.0);
    if (!cfg.comm.adapt) return;
    adapt_ = std::make_unique<SyncPeriodController>(
        SyncPeriodLimits{cfg.comm.adapt_sync_every_min, cfg.comm.adapt_sync_every_max}, cfg.optim.sync_every);
    if (rank0)
      spdlog::info("comm.adapt: local SGD period {}..{} steps, the shortest within {:g}% of the longest's step time "
                   "(kept while within {:g}%); a decision at every parameter average", cfg.comm.adapt_sync_every_min,
                   cfg.comm.adapt_sync_every_max, 100 * SyncPeriodController::kSlack,
                   100 * SyncPeriodController::kKeep);
  }

  void update(TrainingRun& r, int step, bool, Profiler& prof, StepResult& out) override {
    if (step == 1 && !r.cfg.run.dump_grads.empty()) dump_gradients(r, false);
    // Each replica steps on its own loss and gradient norm, meeting the others only at the averages: without
    // skip_nonfinite a non-finite one stops every replica there, before it could be averaged in.
    step_ = step;
    optimizer_update(r, step, r.model->grads(), true, prof, out);
    if (!out.nonfinite.empty() && first_nonfinite_ == 0) first_nonfinite_ = step, nonfinite_ = out.nonfinite;
    if (!local_->due(step, r.cfg.train.steps)) return;
    stop_if_a_replica_was_nonfinite(r, step, first_nonfinite_, nonfinite_, out);
    if (!out.stop.empty()) return;
    const double s0 = trace_clock_us();
    local_->sync(step, r.model->params(), *r.opt);
    out.synced = true;
    prof.wait("local SGD parameter average", s0, trace_clock_us());
  }

  bool adapts() const override { return adapt_ != nullptr; }
  void adapt_after_step(TrainingRun& r, int step, bool synced, const AdaptSample& sample, StepMetrics& row) override {
    row.sync_every = local_->sync_every();
    const std::optional<SyncPeriodDecision> decided = adapt_->observe(step, sample.step_ms, sample.exposed_ms, synced);
    if (!decided) return;
    const SyncPeriodDecision& d = *decided;
    local_->set_sync_every(d.to);
    row.adapt = fmt::format("sync_every {} -> {}: the shortest period within {:g}% of the longest's step time",
                            d.from, d.to, 100 * SyncPeriodController::kSlack);
    if (r.mesh.rank() == 0)
      spdlog::info("comm.adapt from step {}: optim.sync_every {} -> {} (compute {:.1f} ms per step, parameter average "
                   "{:.1f} ms; mean step {:.1f} ms, expected {:.1f} ms, {:.1f} ms at the longest period {})",
                   d.step, d.from, d.to, d.compute_ms, d.sync_ms, d.predicted_from_ms, d.predicted_to_ms,
                   d.fastest_ms, r.cfg.comm.adapt_sync_every_max);
  }

  bool lockstep() const override { return false; }
  bool checkpoints_wait_for_average() const override { return true; }

  // At an average the replicas share their masters (replica 0 writes them); each replica d > 0 adds its own
  // moments, and replica 0 the outer momentum. Between averages (a stop signal's checkpoint) each replica d > 0
  // adds its own masters too, and replica 0 the anchor (the weights of the last average, Nesterov).
  void add_to_checkpoint(TrainingRun& r, CheckpointShard& shard) override {
    const int d = r.mesh.dp_rank();
    const Tensor velocity = local_->velocity(), anchor = local_->anchor();
    const bool between = local_->last_sync() != step_;
    shard.metadata["local_sgd_period"] = std::to_string(local_->sync_every());  // comm.adapt may have moved it
    shard.metadata["local_sgd_last_average"] = std::to_string(local_->last_sync());
    if (d > 0) {  // the counters each replica keeps alone (meta.json has replica 0's)
      shard.metadata["local_sgd_replica"] = std::to_string(d);
      shard.metadata["local_sgd_state"] =
          fmt::format("{} {:.17g} {} {} {}", r.opt->steps_taken(), r.scaler.scale(), r.scaler.good_in_a_row(),
                      r.scaler.skipped_steps(), r.nonfinite_skipped);
    }
    if (d == 0 && !velocity.defined()) return;
    for (const OptimSegment& g : r.opt->segments()) {
      if (g.numel == 0 || !g.in_norm) continue;
      auto host = [&](const Tensor& t) { return checkpoint_host_view(shard, t); };
      std::vector<CheckpointField> fields;
      if (d > 0) {
        fields = {{replica_kind(d, kExpAvgKind), host(r.opt->exp_avg_view(g))},
                  {replica_kind(d, kExpAvgSqKind), host(r.opt->exp_avg_sq_view(g))}};
        if (between) fields.push_back({replica_kind(d, kMasterKind), host(r.opt->master_view(g, r.model->params()))});
      } else {
        fields = {{kOuterVelocityKind, host(velocity.slice(g.offset, {g.numel}))}};
        if (between) fields.push_back({kOuterAnchorKind, host(anchor.slice(g.offset, {g.numel}))});
      }
      shard.pieces.push_back({g.offset, g.numel, std::move(fields)});
    }
  }

  // The optimizer holds replica 0's state (restore_checkpoint): replica d takes its own moments (and, from a
  // checkpoint between averages, masters) where the checkpoint has them, the outer momentum and anchor where it
  // has them, and the period counts from the checkpoint's last average.
  void restore_from(TrainingRun& r, const CheckpointInfo& info) override {
    const int d = r.mesh.dp_rank(), replicas = r.mesh.dp();
    const ParamTable& t = r.model->table();
    const std::string* last = checkpoint_metadata(info, "local_sgd_last_average");
    const int last_average = last ? std::atoi(last->c_str()) : int(info.state.step);
    const bool between = last_average != info.state.step;
    if (d > 0 && checkpoint_has(info, replica_kind(d, kExpAvgKind))) {
      const std::string master = between ? replica_kind(d, kMasterKind) : kMasterKind;
      load_checkpoint_fields(info, t, {master, replica_kind(d, kExpAvgKind), replica_kind(d, kExpAvgSqKind)},
                             [&](int p, const std::vector<const float*>& x) {
                               if (between)
                                 set_weights(*r.model, Tensor(const_cast<float*>(x[0]), {t[p].numel()}, DType::F32),
                                             t[p].offset);
                               r.opt->load_state(t[p].offset, t[p].numel(), x[0], x[1], x[2]);
                             });
      restore_replica_counters(r, info, d);
    }
    const Tensor velocity = local_->velocity(), anchor = local_->anchor();
    // The checkpoint's field `kind` into `into` (laid out like params), where both exist.
    auto load_outer = [&](const char* kind, const Tensor& into) {
      if (!into.defined() || !checkpoint_has(info, kind)) return false;
      load_checkpoint_fields(info, t, {kind}, [&](int p, const std::vector<const float*>& x) {
        copy_convert(into.slice(t[p].offset, {t[p].numel()}),
                     Tensor(const_cast<float*>(x[0]), {t[p].numel()}, DType::F32));
      });
      return true;
    };
    const bool outer = load_outer(kOuterVelocityKind, velocity);
    local_->resume_at(last_average, r.model->params(), *r.opt, load_outer(kOuterAnchorKind, anchor));
    if (adapt_) resume_period(r, info);
    if (r.mesh.rank() != 0) return;
    int held = 1;  // the replicas whose moments the checkpoint holds
    while (checkpoint_has(info, replica_kind(held, kExpAvgKind))) ++held;
    const std::string state = between ? "weights and optimizer moments" : "optimizer moments";
    if (held < replicas)
      spdlog::warn("local SGD: the checkpoint holds the {} of {} replica{}: {} start{} from replica 0's, so the run "
                   "does not continue as an uninterrupted one would", state, held, held > 1 ? "s" : "",
                   held + 1 == replicas ? fmt::format("replica {}", held)
                                        : fmt::format("replicas {}-{}", held, replicas - 1),
                   held + 1 == replicas ? "s" : "");
    else
      spdlog::info("local SGD: each of the {} replicas resumes its own {}{}{}", replicas, state,
                   held > replicas ? fmt::format(" (the checkpoint's other {} are left out)", held - replicas) : "",
                   !between         ? ""
                   : last_average > 0 ? fmt::format(", {} steps after the average of step {}",
                                                    info.state.step - last_average, last_average)
                                      : fmt::format(", {} steps into the first period", info.state.step));
    if (velocity.defined() && !outer)
      spdlog::warn("local SGD: the checkpoint has no outer momentum (written without optim.outer=nesterov): it "
                   "starts at zero");
  }

  // comm.adapt: the period the checkpoint's average left, where it lies within this run's limits, is where the
  // controller starts again (its measurements start afresh). Every rank reads the same value.
  void resume_period(TrainingRun& r, const CheckpointInfo& info) {
    const CommConfig& c = r.cfg.comm;
    const std::string* period = checkpoint_metadata(info, "local_sgd_period");
    if (!period) return;
    const int h = std::atoi(period->c_str());
    if (h < c.adapt_sync_every_min || h > c.adapt_sync_every_max || h == local_->sync_every()) return;
    if (r.mesh.rank() == 0)
      spdlog::info("comm.adapt: local SGD resumes at the checkpoint's period, {} steps (optim.sync_every={})", h,
                   local_->sync_every());
    local_->set_sync_every(h);
    adapt_ =
        std::make_unique<SyncPeriodController>(SyncPeriodLimits{c.adapt_sync_every_min, c.adapt_sync_every_max}, h);
  }

  // Replica d's own counters from its rank files' metadata (add_to_checkpoint), where a file has them.
  static void restore_replica_counters(TrainingRun& r, const CheckpointInfo& info, int d) {
    for (const SafetensorsFile& f : info.files) {
      const auto replica = f.metadata().find("local_sgd_replica"), state = f.metadata().find("local_sgd_state");
      if (replica == f.metadata().end() || state == f.metadata().end() || replica->second != std::to_string(d))
        continue;
      TrainState st;
      std::istringstream in(state->second);
      in >> st.optimizer_steps >> st.loss_scale >> st.good_in_a_row >> st.skipped_steps >> st.nonfinite_skipped;
      const bool read = bool(in);
      if (!read || st.optimizer_steps < 0 || !std::isfinite(st.loss_scale) || st.loss_scale <= 0 ||
          st.good_in_a_row < 0 || st.skipped_steps < 0 || st.nonfinite_skipped < 0)
        input_error("checkpoint file {}: bad local_sgd_state '{}'", f.path(), state->second);
      r.opt->set_steps_taken(st.optimizer_steps);
      if (r.fp16) r.scaler.restore(st.loss_scale, st.good_in_a_row, st.skipped_steps);
      r.nonfinite_skipped = st.nonfinite_skipped;
      return;
    }
  }

 private:
  std::unique_ptr<LocalSGD> local_;
  std::unique_ptr<SyncPeriodController> adapt_;
  int step_ = 0;             // the step this replica last took
  int first_nonfinite_ = 0;  // this replica's first step with a non-finite loss or norm (0: none)
  std::string nonfinite_;    // and what became non-finite then
};

// optim.staleness: this step's gradients start their average in the background, and the averages that are due or
// ready update the weights, each with the learning rate of the step that computed it. A non-finite average is
// skipped on every replica alike (each applies the same averages), since replicas at different steps could not
// stop together. At a sync point (an evaluation, a checkpoint, the last step) every average still in flight is
// applied, so the replicas hold the same weights there.
class StaleStrategy final : public DataParallel {
 public:
  explicit StaleStrategy(int chunks) { hooks_.resize(chunks); }

  void attach(TrainingRun& r) override {
    const OptimConfig& o = r.cfg.optim;
    stale_ = std::make_unique<StaleGradients>(*r.comms.dp, r.model->grads().numel(), o.staleness, o.staleness_policy);
    if (r.mesh.rank() == 0)
      spdlog::info("stale-synchronous data parallelism: gradient averages in the background, no replica more than "
                   "{} steps ahead of the slowest, {} policy; {} gradient slots of {:.1f} MiB",
                   o.staleness, name_of(o.staleness_policy), o.staleness + 1,
                   stale_->state_bytes() / (o.staleness + 1) / 1048576.0);
  }

  void update(TrainingRun& r, int step, bool sync_point, Profiler& prof, StepResult& out) override {
    out.lr = r.sched.at(step);
    out.local_loss_sum = read_scalar(r.loss_sum);
    out.loss = std::nan("");  // known once every rank's figures arrive
    stale_->issue(step, r.model->grads());
    double age_max = 0, age_sum = 0;
    const double w0 = trace_clock_us();
    auto apply = [&](int64_t k, const Tensor& avg) {
      const double age = double(step - k);
      age_max = std::max(age_max, age);
      age_sum += age;
      const double o0 = trace_clock_us();
      const bool ok = r.opt->step(r.model->params(), avg, r.sched.at(int(k)));
      prof.compute("optimizer", o0, trace_clock_us());
      out.applied = out.applied || ok;
      if (ok) {
        last_norm_ = r.opt->last_grad_norm();
      } else {
        ++r.nonfinite_skipped;
        if (r.mesh.rank() == 0)
          spdlog::warn("step {}: the gradient average of step {} has a non-finite norm: skipped on every replica",
                       step, k);
      }
    };
    const int n = sync_point ? stale_->finish(apply) : stale_->apply_ready(step, apply);
    prof.wait("stale gradient averages", w0, trace_clock_us());
    out.staleness_max = age_max;
    out.staleness_mean = n > 0 ? age_sum / n : 0.0;
    out.grad_norm = last_norm_;
  }

  bool lockstep() const override { return false; }

 private:
  std::unique_ptr<StaleGradients> stale_;
  double last_norm_ = std::nan("");  // the norm of the last average applied (none yet)
};

}  // namespace

std::unique_ptr<DataParallel> make_data_parallel(const Config& cfg, const DeviceMesh& mesh, MeshComms& comms,
                                                 PipelineChunks& model, bool on_demand_gathers, bool log) {
  // Local SGD and staleness reduce no buckets; the config refuses ZeRO with either.
  if (cfg.optim.sync_every > 0) return std::make_unique<LocalSgdStrategy>(model.size());
  if (cfg.optim.staleness > 0) return std::make_unique<StaleStrategy>(model.size());
  if (cfg.optim.zero == 3) return std::make_unique<FullySharded>(cfg, mesh, comms, model, on_demand_gathers, log);
  return std::make_unique<Synchronous>(cfg, mesh, comms, model, on_demand_gathers, log);
}

}  // namespace mt
