#include "train/training_run.h"

#include <mpi.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "comm/comm_util.h"
#include "comm/make_communicator.h"
#include "comm/mpi_init.h"
#include "core/arena.h"
#include "core/device.h"
#include "core/errors.h"
#include "plan/activation_bytes.h"
#include "train/checkpoint.h"
#include "train/copies_check.h"
#include "train/grad_reducers.h"
#include "train/ignored_settings.h"
#include "train/memory_report.h"
#include "train/model_config.h"
#include "train/model_gather.h"
#include "train/resume.h"

namespace mt {

namespace {

// Model, data and initial weights. The initial weights are made (or loaded) in fp32 on the host: on a CPU in fp32
// straight into the parameters, otherwise into `masters`, then copied to the compute copy (rounded); the
// optimizer takes the fp32 masters from there once it exists. Under ZeRO-3 no rank holds the whole model: a
// loaded model goes to `masters` (the rank's part of the file, once, at set-up), and a new one is made parameter
// by parameter once the shards exist (init_sharded).
Tensor build_model_and_data(TrainingRun& r) {
  const Config& cfg = r.cfg;
  const DeviceMesh& mesh = r.mesh;
  const bool zero3 = cfg.optim.zero == 3;
  // ZeRO-2 reducing every micro-batch keeps no flat gradient buffer (grad_reducers.h), ZeRO-3 no flat parameters.
  r.model = std::make_unique<PipelineChunks>(r.gcfg, r.sharding, r.stage_layers, mesh.pp(), mesh.pp_rank(), r.compute,
                                             r.dev, !sharded_gradients(cfg), !zero3);
  PipelineChunks& model = *r.model;
  const bool host_masters = r.mixed || r.dev == Device::CUDA || zero3;
  const bool loaded = !cfg.model.init_from.empty();
  const Shape flat{std::max<int64_t>(1, model.table().total_numel())};
  Tensor masters = !host_masters             ? model.params()
                   : (zero3 && !loaded)      ? Tensor()
                                             : Tensor::zeros(flat, DType::F32);
  if (mesh.tp() > 1) model.set_tp_comm(r.comms.tp.get());
  if (mesh.cp() > 1) model.set_cp_comm(r.comms.cp.get());
  // Set-up reads files and may fail with bad input on some ranks only: every rank learns whether any failed
  // before the first collective of the run, so they all stop with exit status 2 instead of leaving peers waiting.
  agreed_setup([&] {
    if (mesh.rank() == 0) {
      std::filesystem::create_directories(cfg.run.dir);
      std::ofstream f(cfg.run.dir + "/config.yaml");
      if (!f) input_error("run.dir: cannot write {}/config.yaml", cfg.run.dir);
      f << to_yaml(cfg);
    }
    r.data = load_dataset(cfg);
    if (loaded) model.load_safetensors(cfg.model.init_from, masters);
    else if (masters.defined()) model.init(cfg.train.seed, cfg.model.init_std, masters);
    if (host_masters && !zero3) copy_convert(model.params(), masters);
  }, MPI_COMM_WORLD);
  spdlog::info("data: {}", r.data.train.description);
  if (r.data.entropy_rate_nats >= 0)
    spdlog::info("data: best achievable loss (entropy rate) {:.4f} nats; uniform guess ln(V) = {:.4f}",
                 r.data.entropy_rate_nats, std::log(double(cfg.model.vocab_size)));
  const GPTConfig& g = r.gcfg;
  const std::string llama = g.llama() ? fmt::format(" KV={} SwiGLU hidden {}, rotary theta {:g}, RMSNorm eps {:g}, "
                                                    "{} head", g.kv_heads(), g.mlp_hidden(), g.rope_theta, g.norm_eps,
                                                    g.tie_embeddings ? "tied" : "untied")
                                      : "";
  spdlog::info("model: {} L={} NH={}{} C={} T={} V={} (padded {}): {:.3f}M parameters{}",
               g.llama() ? "Llama" : "GPT-2", cfg.model.n_layer, cfg.model.n_head, llama, cfg.model.d_model, r.T,
               cfg.model.vocab_size, padded_vocab(cfg.model.vocab_size, mesh.tp()), model.num_parameters() / 1e6,
               cfg.model.init_from.empty() ? "" : ", from " + cfg.model.init_from);
  if (g.recompute != Recompute::None)
    spdlog::info("recompute: {} ({})", name_of(g.recompute),
                 g.recompute == Recompute::Full
                     ? "each block's forward again in its backward; records keep the block inputs"
                 : g.recompute == Recompute::Light
                     ? "the norms' outputs and the MLP's activation again in each block's backward"
                     : "the attention probabilities again before each attention backward");
  if (mesh.pp() > 1) {
    std::string stages;
    for (size_t s = 0; s < r.stage_layers.size(); ++s) stages += fmt::format("{}{}", s ? ", " : "", r.stage_layers[s]);
    spdlog::info("pipeline: {} stages of [{}] blocks over {} ranks ({} chunk{} each), schedule {}, {} micro-batches",
                 r.stage_layers.size(), stages, mesh.pp(), model.size(), model.size() > 1 ? "s" : "",
                 name_of(cfg.parallel.schedule), r.n_micro);
  }
  return host_masters ? masters : Tensor();
}

// The fp32 weights of the elements [offset, offset + part.numel()) of the rank's layout into the compute copy
// and, with a 16-bit compute copy, the optimizer's masters.
void load_weights(TrainingRun& r, const Tensor& part, int64_t offset) {
  r.dp->set_weights(*r.model, part, offset);
  if (r.mixed) r.opt->load_masters(part, offset);
}

// ZeRO-3's new model, parameter by parameter (each drawn whole, GPT::init_param), so that no rank holds more than
// one parameter beyond its shards. Each is drawn into its own gradient's buffer (a ring slot, or a pinned unit's):
// nothing reads it before the first step zeroes it (begin_step) or a gather or a gradient overwrites it (a ring
// shared with the parameters), so the set-up needs
// no memory beyond the step's (a fresh buffer of the largest parameter, the embedding in a large-vocabulary model,
// raised the set-up's peak above it).
void init_sharded(TrainingRun& r) {
  PipelineChunks& model = *r.model;
  for (int c = 0; c < model.size(); ++c) {
    const ParamTable& t = model.chunk(c).table();
    for (int p = 0; p < t.size(); ++p) {
      const Tensor grad = model.chunk(c).grad(p);
      const bool in_grad = grad.device() == Device::CPU && grad.dtype() == DType::F32;  // else a buffer of its own
      const Tensor part = in_grad ? grad.view({t[p].numel()}) : Tensor::zeros({t[p].numel()}, DType::F32);
      model.chunk(c).init_param(r.cfg.train.seed, r.cfg.model.init_std, p, part);  // every element, padding too
      load_weights(r, part, model.base(c) + t[p].offset);
    }
  }
}

// The optimizer over this rank's segments. In fp32 the parameters are the master weights: under ZeRO-1 each rank
// updates its shards of them in place and all-gathers the rest; the moments are sharded (packed, 1/dp of the full
// optimizer's). With a 16-bit compute copy the optimizer keeps the fp32 masters of its segments (sharded like the
// moments), casts each updated segment into the compute copy, and under ZeRO-1 the all-gather carries the
// compute dtype.
void build_optimizer(TrainingRun& r) {
  const Config& cfg = r.cfg;
  PipelineChunks& model = *r.model;
  OptimizerSettings os;
  os.sgd = cfg.optim.name == OptimizerKind::SGD;
  os.momentum = cfg.optim.momentum;
  os.beta1 = cfg.optim.beta1;
  os.beta2 = cfg.optim.beta2;
  os.eps = cfg.optim.eps;
  os.weight_decay = cfg.optim.weight_decay;
  os.grad_clip = cfg.train.grad_clip;
  int64_t state_numel = 0;
  std::vector<OptimSegment> segments = r.dp->optimizer_segments(model, state_numel, os);
  if (model.tied_copy_is_head()) {
    // The gradient norm counts the tied embedding once: the first stage's copy.
    const ParamSpec& wte = model.chunk(r.tied).table()[model.tied_param()];
    const int64_t lo = model.base(r.tied) + wte.offset, hi = lo + wte.numel();
    for (OptimSegment& g : segments)
      if (g.offset >= lo && g.offset + g.numel <= hi) g.in_norm = false;
  }
  const DeviceMesh& mesh = r.mesh;
  r.opt = std::make_unique<Optimizer>(segments, state_numel, DType::F32, r.dev, os,
                                      r.dp->shards_optimizer() ? r.comms.dp.get() : nullptr,
                                      mesh.tp() > 1 ? r.comms.tp.get() : nullptr,
                                      mesh.pp() > 1 ? r.comms.pp.get() : nullptr, r.mixed);
}

// Resume: the newest complete checkpoint (run.resume: auto), a given one, or none. Its masters and moments, laid
// out for this mesh whatever mesh wrote them, replace the initial state; the compute copy is their rounding.
// Every rank reads the same checkpoint and the ranks agree on each verdict. A damaged checkpoint found by auto is
// named and the next older complete one tried; a given one that is damaged, or one whose config disagrees with
// this run's (CheckpointMismatch), stops every rank with exit status 2.
void resume(TrainingRun& r) {
  const Config& cfg = r.cfg;
  if (cfg.run.resume == "none") return;
  const bool automatic = cfg.run.resume == "auto", rank0 = r.mesh.rank() == 0;
  std::vector<std::string> candidates;
  if (automatic) {
    std::vector<std::string> skipped;
    candidates = complete_checkpoints(r.ckpt_root, &skipped);
    if (rank0)
      for (const std::string& s : skipped) spdlog::warn("run.resume=auto: skipping {}", s);
  } else {
    candidates = {cfg.run.resume};
  }
  std::vector<std::string> damaged;
  for (const std::string& resume_dir : candidates) {
    std::string error;
    int verdict = 0;  // 0 read, 1 damaged, 2 refused outright
    CheckpointInfo info;
    const double l0 = trace_clock_us();
    try {
      info = restore_checkpoint(resume_dir, cfg, *r.model, *r.opt, [&](const Tensor& part, int64_t offset) {
        r.dp->set_weights(*r.model, part, offset);
      });
      if (r.fp16) r.scaler.restore(info.state.loss_scale, info.state.good_in_a_row, info.state.skipped_steps);
      r.nonfinite_skipped = info.state.nonfinite_skipped;
      r.dp->restore_from(r, info);  // after the shared state, which a strategy may replace with its rank's own
    } catch (const CheckpointMismatch& e) {
      error = e.what(), verdict = 2;
    } catch (const InputError& e) {
      error = e.what(), verdict = automatic ? 1 : 2;
    }
    const int worst = allreduce_int_yielding(verdict, MPI_MAX, MPI_COMM_WORLD);
    if (worst == 2 || (worst == 1 && resume_dir == candidates.back())) {
      if (worst == 1 && verdict == 1)
        error = fmt::format("run.resume=auto: no usable checkpoint in {}: {}{} (run.resume=none starts afresh)",
                            r.ckpt_root, error, damaged.empty() ? "" : "; also damaged: " + damaged.front());
      agree_on_setup(worst == verdict ? error : std::string(), MPI_COMM_WORLD);
      throw SetupError("stopped: another rank refused the checkpoint (its message says why)");
    }
    if (worst == 1) {
      if (rank0 || verdict == 1)
        spdlog::warn("run.resume=auto: {} is damaged and is skipped: {}{}; falling back to the previous complete "
                     "checkpoint", resume_dir, verdict == 1 ? error : "another rank could not read it",
                     rank0 ? "" : fmt::format(" [rank {}]", r.mesh.rank()));
      damaged.push_back(resume_dir);
      continue;
    }
    r.start_step = int(info.state.step) + 1;
    spdlog::info("resumed from {} (step {}, written on {}) in {:.0f} ms{}", resume_dir, info.state.step, info.mesh,
                 (trace_clock_us() - l0) / 1000.0,
                 damaged.empty() ? "" : fmt::format(" (after skipping {} damaged newer checkpoint{})", damaged.size(),
                                                    damaged.size() > 1 ? "s" : ""));
    if (rank0) {
      for (const std::string& change : resume_changes(info.config, cfg, info.state.step)) spdlog::warn("{}", change);
      for (const std::string& restart : resume_restarts(cfg)) spdlog::warn("{}", restart);
    }
    return;
  }
}

// The host memory /proc/meminfo calls available (bytes), or -1 where it cannot be read.
double available_host_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  double kb = 0;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return -1;
}

// Before the first step allocates any activation: the least activation memory the steps need on this rank (one
// record per pipeline chunk and one backward pass's scratch, counted by the planner's code without allocating;
// the schedule keeps more in flight), refused with exit status 2 when the host has less available. A GPU model's
// records live on the GPU, which this does not check.
void check_activation_memory(const TrainingRun& r) {
  if (r.dev != Device::CPU) return;
  const bool split = r.cfg.parallel.schedule == PipelineSchedule::ZB1;
  double need = 0, scratch = 0;
  const bool over_params = r.model->size() > 0 && r.model->chunk(0).grads_over_params();
  for (int c = 0; c < r.model->size(); ++c) {
    const GPT& g = r.model->chunk(c);
    const plan::StageConfig stage{g.config(), g.part()};
    need += double(plan::record_bytes(stage, r.mb, r.T_rank, g.dtype(), split, r.mesh.cp()));
    scratch = std::max(scratch, double(plan::backward_scratch_bytes(stage, r.mb, r.T_rank, g.dtype(), split,
                                                                    r.mesh.cp(), over_params)));
  }
  need += scratch;
  const double available = available_host_bytes();
  std::string error;
  if (available > 0 && need > available)
    error = fmt::format("activations need at least {:.0f} bytes ({:.1f} GiB) on this rank (one record of {} sequences "
                        "of {} tokens per pipeline chunk, from model.seq_len={}, train.micro_batch={}, model.d_model={}, "
                        "model.n_layer={}, parallel.pp={}, precision.compute={}), and the host has {:.0f} bytes "
                        "({:.1f} GiB) available (MemAvailable): lower model.seq_len or train.micro_batch, or add "
                        "parallel.pp stages or parallel.cp ranks", need, need / 1073741824.0, r.mb, r.T_rank,
                        r.cfg.model.seq_len,
                        r.cfg.train.micro_batch, r.cfg.model.d_model, r.cfg.model.n_layer, r.cfg.parallel.pp,
                        dtype_name(r.compute), available, available / 1073741824.0);
  agree_on_setup(error, MPI_COMM_WORLD);
}

void log_precision_and_memory(const TrainingRun& r) {
  const PipelineChunks& model = *r.model;
  spdlog::info("precision: compute {}, gradients and master weights fp32, data-parallel reduction in {}{}",
               dtype_name(r.compute), dtype_name(r.cfg.precision.grad_reduce),
               r.fp16 ? (r.scaler.dynamic() ? fmt::format(", dynamic loss scale from {:g}", r.scaler.scale())
                                            : fmt::format(", fixed loss scale {:g}", r.scaler.scale()))
                      : "");
  spdlog::info("memory per rank: parameters {:.1f} MiB ({}), gradients {:.1f} MiB, optimizer state {:.1f} MiB ({} "
               "bytes){} ({} micro-batches of {} x {} tokens per step per rank)",
               r.dp->parameter_bytes(model) / 1048576.0, dtype_name(r.compute),
               r.dp->gradient_bytes(model) / 1048576.0, r.opt->state_bytes() / 1048576.0, r.opt->state_bytes(),
               r.dp->memory_note(r.mixed), r.n_micro, r.mb, r.T_rank);
}

}  // namespace

std::unique_ptr<TrainingRun> build_training_run(const Config& cfg, const DeviceMesh& mesh, MeshComms& comms,
                                                bool nccl, const CommOptions& copts, Profiler& prof) {
  auto run = std::make_unique<TrainingRun>(cfg, mesh, comms);
  TrainingRun& r = *run;
  const bool rank0 = mesh.rank() == 0;
  r.nccl = nccl;
  r.copts = copts;
  r.T = cfg.model.seq_len;
  r.T_rank = r.T / mesh.cp();
  r.mb = cfg.train.micro_batch;
  r.gb = cfg.train.global_batch;
  r.local_batch = r.gb / mesh.dp();
  r.n_micro = r.local_batch / r.mb;
  r.tokens_per_step = int64_t(r.gb) * r.T;
  r.gcfg = gpt_config(cfg);
  r.sharding = {mesh.tp(), mesh.tp_rank(), cfg.parallel.sequence_parallel};
  r.stage_layers = layers_per_stage(cfg);
  // Mixed precision: the model's parameters and activations are in the compute dtype, its gradients in fp32.
  r.compute = cfg.precision.compute;
  r.mixed = r.compute != DType::F32;
  r.fp16 = r.compute == DType::F16;  // fp16 multiplies the loss's gradient by the scaler's scale
  r.dev = cfg.device;
  Tensor masters = build_model_and_data(r);

  // Data parallelism (data_parallel.h): the strategy, then the optimizer over its segments (under ZeRO this rank's
  // shards of the fp32 masters and moments), then what the strategy builds from the optimizer.
  r.tied = r.model->tied_chunk();
  r.hooks = TestHooks::from_env();
  r.dp = make_data_parallel(cfg, mesh, comms, *r.model, r.hooks.late_gather_step >= 0, rank0);
  build_optimizer(r);
  if (r.dp->shards_parameters() && !masters.defined()) init_sharded(r);
  else if (r.dp->shards_parameters()) load_weights(r, masters, 0);
  else if (r.mixed) r.opt->load_masters(masters);
  masters = Tensor();  // the optimizer (or the GPU copy) holds the weights from here on
  r.dp->attach(r);
  if (r.fp16) r.scaler = LossScaler::from_config(cfg.precision.loss_scale);
  if (rank0)
    for (const std::string& ignored : ignored_settings(cfg, mesh)) spdlog::warn("{}", ignored);
  if (rank0 && cfg.optim.warmup_steps > cfg.train.steps)
    spdlog::warn("optim.warmup_steps={} is more than train.steps={}: the learning rate never reaches optim.lr={:g} (the "
                 "last step takes {:.3e})", cfg.optim.warmup_steps, cfg.train.steps, cfg.optim.lr,
                 lr_schedule(cfg).at(cfg.train.steps));
  if (cfg.optim.zero > 0 && mesh.replicas() == 1 && rank0)
    spdlog::warn("optim.zero={} shards nothing here: ZeRO shards over the dp x cp replicas and this mesh has one; its "
                 "gathers and reductions still run, so optim.zero=0 is faster", cfg.optim.zero);
  r.ckpt_root = cfg.run.dir + "/checkpoints";
  resume(r);
  r.sched = lr_schedule(cfg);
  r.runner = std::make_unique<PipelineRunner>(*r.model, comms.pp.get(), cfg.parallel.schedule, r.n_micro, r.mb,
                                              r.T_rank, prof);
  r.straggler = rank_straggler(cfg.train.straggler, mesh.rank());
  if (r.straggler.chosen) r.runner->set_compute_stretch(r.straggler.slowdown);
  const StragglerSettings& st = cfg.train.straggler;
  if (rank0 && (st.slowdown > 1 || st.delay_ms > 0)) {
    std::string who = st.ranks.empty() ? "every rank" : "rank";
    for (size_t i = 0; i < st.ranks.size(); ++i) who += fmt::format("{}{}", i ? ", " : " ", st.ranks[i]);
    spdlog::info("train.straggler: {} computes {:g}x slower{} (slept: no CPU)", who, st.slowdown,
                 st.delay_ms > 0 ? fmt::format(" and sleeps {:g} ms on average (log-normal sigma {:g}) before each step",
                                               st.delay_ms, st.delay_sigma)
                                 : "");
  }
  r.loss_sum = Tensor::zeros({1}, DType::F32, r.dev);
  r.train_batches = std::make_unique<Batcher>(&r.data.train.tokens, r.T, r.gb, cfg.data.order, cfg.train.seed);
  r.val_batches = std::make_unique<Batcher>(&r.data.val.tokens, r.T, r.gb, DataOrder::Sequential, cfg.train.seed);
  // An evaluation reads train.eval_batches global batches from the validation split's start, wrapping around it:
  // past one pass it averages the same windows again and only costs time.
  const int64_t val_tokens = int64_t(r.data.val.tokens.size()), val_windows = r.val_batches->windows();
  const int64_t eval_sequences = int64_t(cfg.train.eval_batches) * r.gb;
  if (rank0 && cfg.train.eval_every > 0 && val_windows >= 1 && eval_sequences > val_windows)
    spdlog::warn("train.eval_batches={} reads {} sequences of {} tokens per evaluation, but the validation split ({} "
                 "tokens) holds {} windows: each evaluation reads it {:.1f} times over ({})", cfg.train.eval_batches,
                 eval_sequences, r.T, val_tokens, val_windows, double(eval_sequences) / double(val_windows),
                 val_windows >= r.gb ? fmt::format("train.eval_batches={} reads it once", val_windows / r.gb)
                                     : std::string("even one global batch holds more sequences than it has windows: "
                                                   "a larger data.val_fraction gives it more"));
  log_precision_and_memory(r);
  check_activation_memory(r);
  return run;
}

void checkpoint_run(TrainingRun& r, int step) {
  r.dp->wait_params();
  const double t0 = trace_clock_us();
  const TrainState st{step, r.opt->steps_taken(), r.scaler.scale(), r.scaler.good_in_a_row(),
                      r.scaler.skipped_steps(), r.nonfinite_skipped};
  CheckpointShard shard =
      checkpoint_shard(*r.model, r.dp->optimizer_params(*r.model), *r.opt, r.mesh, r.dp->shards_optimizer());
  r.dp->add_to_checkpoint(r, shard);
  const std::string dir = write_checkpoint(r.ckpt_root, r.cfg, st, shard, *r.comms.world, r.cfg.run.keep_checkpoints);
  spdlog::info("checkpoint: step {} written to {} in {:.0f} ms", step, dir, (trace_clock_us() - t0) / 1000.0);
}

void export_run_safetensors(TrainingRun& r, const std::string& path, const Tensor& flat) {
  const Tensor host = to_host(flat);
  if (!r.nccl) return write_gathered_safetensors(path, *r.model, host, r.mesh, r.comms, r.gcfg, r.stage_layers);
  // The gather runs on host memory, so NCCL-backed meshes gather through MPI communicators made for it.
  MeshComms mpi = make_mesh_comms(r.mesh, MPI_COMM_WORLD, [&](MPI_Comm c, const std::string& name) {
    return make_communicator(c, name, r.copts);
  });
  write_gathered_safetensors(path, *r.model, host, r.mesh, mpi, r.gcfg, r.stage_layers);
}

Tensor export_weights(TrainingRun& r) {
  r.dp->wait_params();
  PipelineChunks& model = *r.model;
  if (!r.mixed && !r.dp->shards_parameters()) return model.params();
  // Without ZeRO the masters are laid out like the parameters: no copy (for the copies check every N steps, a fresh
  // buffer the size of the model, page-faulted in each time, cost 3-4 times its hash on a 2-core VM).
  if (!r.dp->shards_optimizer()) {
    const Tensor masters = r.opt->masters_in_param_layout(model.table().total_numel());
    if (masters.defined()) return masters;
  }
  Tensor weights = Tensor::zeros({std::max<int64_t>(1, model.table().total_numel())}, DType::F32, r.dev);
  r.opt->store_weights(weights, r.dp->optimizer_params(model));
  r.dp->gather_shards(model, weights);
  return weights;
}

void finish_run(TrainingRun& r, size_t training_peak) {
  PipelineChunks& model = *r.model;
  // The export holds the fp32 masters: gathered from the optimizer (under ZeRO from every dp rank's shards).
  const Tensor weights = export_weights(r);
  const std::string copies = check_weight_copies(r, std::max(r.cfg.train.steps, r.start_step - 1), weights);
  if (r.mesh.rank() == 0 && !copies.empty()) spdlog::info("{}", copies);
  export_run_safetensors(r, r.cfg.run.dir + "/model.safetensors", weights);
  if (r.mesh.rank() == 0) model.chunk(0).export_hf_config(r.cfg.run.dir + "/config.json");
  RankMemory mem;
  mem.params = double(r.dp->parameter_bytes(model));
  mem.grads = double(r.dp->gradient_bytes(model));
  mem.optimizer = double(r.opt->state_bytes());
  for (int c = 0; c < model.size(); ++c) {
    mem.activations += double(r.runner->records(c) * r.runner->record_bytes(c));
    mem.records += double(r.runner->records(c));
  }
  mem.buffers = double(r.runner->buffer_bytes());
  mem.peak_tensors = double(training_peak);
  mem.peak_rss = peak_rss_bytes();
  report_memory(mem, r.mesh, *r.comms.world, r.cfg.run.dir + "/memory.json");
}

}  // namespace mt
