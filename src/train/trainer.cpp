// The step loop. Per step: zero gradients; run this rank's pipeline schedule over its model chunks (with pp = 1:
// forward and backward per micro-batch), each micro-batch's forward scaling the loss's gradient by 1 / tokens
// on this dp rank, backward passes accumulating, and each chunk's last gradient pass starting its finished
// gradient buckets' all-reduce (average over dp) or, under ZeRO-1, reduce-scatter; sum the tied embedding's
// gradient between the first and last stage; wait for the buckets; clip and AdamW (under ZeRO-1 on this rank's
// shards, then all-gather); then the single read of device scalars (loss and gradient norm) for the log.
// Activation records and scratch are sized by the first step, so steady-state steps allocate nothing.
#include "train/trainer.h"

#include <mpi.h>
#include <omp.h>
#include <spdlog/spdlog.h>


#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>

#include "comm/comm_util.h"
#include "comm/hierarchical_communicator.h"
#include "comm/make_communicator.h"
#include "comm/mpi_init.h"
#include "comm/nccl_communicator.h"
#include "core/arena.h"
#include "core/device.h"
#include "core/errors.h"
#include "core/threads.h"
#include "data/batcher.h"
#include "model/pipeline_chunks.h"
#include "optim/local_sgd.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/grad_buckets.h"
#include "parallel/mesh.h"
#include "train/comm_timeline.h"
#include "train/dataset.h"
#include "train/grad_reducers.h"
#include "train/memory_report.h"
#include "train/metrics.h"
#include "train/model_config.h"
#include "train/model_gather.h"
#include "train/pipeline_runner.h"
#include "train/profiler.h"
#include "train/resume.h"
#include "train/test_hooks.h"
#include "train/zero_shards.h"

namespace mt {

namespace {

// Bad input found by every rank together (see agree_on_setup): the ranks exit with status 2 in step.
struct SetupError : InputError {
  using InputError::InputError;
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

std::string format_duration(double seconds) {
  long s = std::lround(std::max(0.0, seconds));
  return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
}

// The NCCL communicator of a mesh axis, on this rank's GPU and ordered after its compute stream.
std::unique_ptr<Communicator> make_device_communicator(MPI_Comm c, const std::string& name, const CommOptions& o) {
#ifdef MESHTRAIN_WITH_CUDA
  return make_nccl_communicator(c, name, o, cuda_compute_stream());
#else
  (void)c, (void)o;
  MT_CHECK(false, "communicator {}: NCCL needs the CUDA backend", name);
  return nullptr;
#endif
}

// A GPU model's memory at the end of training: the caching allocator's peak and what it holds, the activation
// records, and whether the steps after the first allocated from the driver (they should not).
void log_gpu_memory(const PipelineRunner& runner, int chunks, uint64_t mallocs_after_first_step) {
  const DeviceMemoryStats s = device_memory_stats();
  double records = 0;
  for (int c = 0; c < chunks; ++c) records += double(runner.records(c) * runner.record_bytes(c));
  spdlog::info("GPU memory: peak {:.1f} MiB in tensors (activation records {:.1f} MiB), {:.1f} MiB held from the "
               "driver in {} cudaMalloc calls, {} of them after the first step",
               s.peak / 1048576.0, records / 1048576.0, s.reserved / 1048576.0, s.driver_allocations,
               s.driver_allocations - mallocs_after_first_step);
}

// Collective over `group`: whether `flag` is true on any of its ranks.
bool any_rank(bool flag, Communicator& group) {
  Tensor t = Tensor::zeros({1}, DType::F32);
  t.data_as<float>()[0] = flag ? 1.0f : 0.0f;
  group.all_reduce(t, ReduceOp::Max);
  return t.data_as<float>()[0] > 0;
}

// How the host communicators move data, for the log line.
std::string transport_description(const CommOptions& o) {
  const std::string mpi = o.blocking_waits ? "mpi, blocking waits" : "mpi, polled waits";
  switch (o.transport) {
    case CommOptions::Transport::Shm: return "shared memory";
    case CommOptions::Transport::Mpi: return mpi;
    case CommOptions::Transport::Auto: break;
  }
  return "shared memory within a node, " + mpi + " across nodes";
}

// comm.wait=auto: spinning waits pay off only when every compute thread of the node has a core of its own.
bool blocking_waits(const CommConfig& c, int ranks_on_node, int threads_per_rank) {
  if (c.wait != CommWait::Auto) return c.wait == CommWait::Block;
  return ranks_on_node * threads_per_rank <= omp_get_num_procs();
}

// comm.backend for the host transports: shm and mpi force one; auto (and nccl, for the communicators NCCL does not
// take) choose per group. Device tensors go through the MPI transport, which stages them in pinned host memory.
CommOptions comm_options(const CommConfig& c, bool blocking, bool gpu) {
  CommOptions o;
  o.transport = c.backend == CommBackend::Shm ? CommOptions::Transport::Shm
                : c.backend == CommBackend::Mpi || gpu ? CommOptions::Transport::Mpi
                                                       : CommOptions::Transport::Auto;
  o.blocking_waits = blocking;
  o.latency_us = c.emulate.latency_us;
  o.bandwidth_gbps = c.emulate.bandwidth_gbps;
  o.ranks_per_node = c.emulate.ranks_per_node;
  o.inter_latency_us = c.emulate.inter_latency_us;
  o.inter_bandwidth_gbps = c.emulate.inter_bandwidth_gbps;
  o.timeout_s = c.timeout_s;
  return o;
}

}  // namespace

namespace {

// Throws SetupError on every rank when any rank's set-up failed (`error` non-empty on that rank).
void agree_on_setup(const std::string& error, MPI_Comm world) {
  int failed = error.empty() ? 0 : 1, any = failed;
  MPI_CHECK(MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, world));
  if (!any) return;
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  if (failed && rank != 0) spdlog::error("[rank {}] {}", rank, error);  // main prints rank 0's message
  throw SetupError(failed ? error : "stopped: another rank's set-up failed (its message says why)");
}

// The run on an established mesh. Kept apart from run_training so that the communicators outlive an exception
// until every rank has been told to stop (see run_training).
void train_on_mesh(const Config& cfg, const DeviceMesh& mesh, MeshComms& comms, bool nccl, CommTimeline& timeline,
                   Profiler& prof, const CommOptions& copts, int threads) {
  const int world = mesh.world_size();
  const bool rank0 = mesh.rank() == 0;
  Communicator& dp = *comms.dp;
  spdlog::info("{}, device {}{}, {} compute threads per rank, communication {}{}", mesh.describe(),
               name_of(cfg.device),
               cfg.device == Device::CUDA ? fmt::format(" (GPU {} of this node)", cuda_device_index()) : "", threads,
               nccl ? "nccl" : transport_description(copts),
               copts.emulating() ? fmt::format(", emulated network {} us / {} GB/s", copts.latency_us,
                                               copts.bandwidth_gbps)
                                 : "");
  if (rank0 && world > 1) spdlog::info("mesh ranks:\n{}", mesh.table());

  // Set-up reads files and may fail with bad input on some ranks only: every rank learns whether any failed
  // before the first collective of the run, so they all stop with exit status 2 instead of leaving peers waiting.
  const int T = cfg.model.seq_len, mb = cfg.train.micro_batch, gb = cfg.train.global_batch;
  const int local_batch = gb / mesh.dp(), n_micro = local_batch / mb;
  GPTConfig gcfg = gpt_config(cfg.model);
  gcfg.tp = mesh.tp();
  gcfg.tp_rank = mesh.tp_rank();
  gcfg.sequence_parallel = cfg.parallel.sequence_parallel;
  const std::vector<int> stage_layers = layers_per_stage(cfg);
  // Mixed precision: the model's parameters and activations are in the compute dtype, its gradients in fp32;
  // the fp32 master weights start in `masters` (init or load) and move into the optimizer once it exists.
  const DType compute = cfg.precision.compute;
  const bool mixed = compute != DType::F32;
  const Device dev = cfg.device;
  PipelineChunks model(gcfg, stage_layers, mesh.pp(), mesh.pp_rank(), compute, dev);
  // The initial weights are made (or loaded) in fp32 on the host: on a CPU in fp32 straight into the parameters,
  // otherwise into `masters`, then copied to the compute copy (rounded) and the optimizer's masters.
  const bool host_masters = mixed || dev == Device::CUDA;
  Tensor masters = host_masters ? Tensor::zeros(model.params().shape(), DType::F32) : model.params();
  if (mesh.tp() > 1) model.set_tp_comm(comms.tp.get());
  Communicator* tp_norm = mesh.tp() > 1 ? comms.tp.get() : nullptr;
  Dataset data;
  std::string setup_error;
  try {
    if (rank0) {
      std::filesystem::create_directories(cfg.run.dir);
      std::ofstream f(cfg.run.dir + "/config.yaml");
      if (!f) input_error("run.dir: cannot write {}/config.yaml", cfg.run.dir);
      f << to_yaml(cfg);
    }
    data = load_dataset(cfg);
    if (cfg.model.init_from.empty()) model.init(cfg.train.seed, cfg.model.init_std, masters);
    else model.load_safetensors(cfg.model.init_from, masters);
    if (host_masters) copy_convert(model.params(), masters);
  } catch (const InputError& e) {
    setup_error = e.what();
  }
  agree_on_setup(setup_error, MPI_COMM_WORLD);
  spdlog::info("data: {}", data.train.description);
  if (data.entropy_rate_nats >= 0)
    spdlog::info("data: best achievable loss (entropy rate) {:.4f} nats; uniform guess ln(V) = {:.4f}",
                 data.entropy_rate_nats, std::log(double(cfg.model.vocab_size)));
  spdlog::info("model: GPT-2 L={} NH={} C={} T={} V={} (padded {}): {:.3f}M parameters{}", cfg.model.n_layer,
               cfg.model.n_head, cfg.model.d_model, T, cfg.model.vocab_size, padded_vocab(cfg.model.vocab_size, mesh.tp()),
               model.num_parameters() / 1e6, cfg.model.init_from.empty() ? "" : ", from " + cfg.model.init_from);
  if (mesh.pp() > 1) {
    std::string stages;
    for (size_t s = 0; s < stage_layers.size(); ++s) stages += fmt::format("{}{}", s ? ", " : "", stage_layers[s]);
    spdlog::info("pipeline: {} stages of [{}] blocks over {} ranks ({} chunk{} each), schedule {}, {} micro-batches",
                 stage_layers.size(), stages, mesh.pp(), model.size(), model.size() > 1 ? "s" : "",
                 name_of(cfg.parallel.schedule), n_micro);
  }

  // Data parallelism (grad_reducers.h): ZeRO-1 keeps only this rank's shards of the fp32 masters' moments.
  // Local SGD averages parameters every optim.sync_every steps instead of gradients every step.
  const bool zero = cfg.optim.zero == 1;
  const bool local_sgd = cfg.optim.sync_every > 0;
  const int tied = model.tied_chunk();
  ChunkReducers dp_reduce = make_grad_reducers(cfg, model, dp, mesh.dp(), rank0);
  std::vector<std::unique_ptr<GradReducer>>& reducers = dp_reduce.owned;
  OptimizerSettings os;
  os.sgd = cfg.optim.name == OptimizerKind::SGD;
  os.momentum = cfg.optim.momentum;
  os.beta1 = cfg.optim.beta1;
  os.beta2 = cfg.optim.beta2;
  os.eps = cfg.optim.eps;
  os.weight_decay = cfg.optim.weight_decay;
  os.grad_clip = cfg.train.grad_clip;
  // In fp32 the parameters are the master weights: under ZeRO-1 each rank updates its shards of them in place
  // and all-gathers the rest; the moments are sharded (packed, 1/dp of the full optimizer's). With a 16-bit
  // compute copy the optimizer keeps the fp32 masters of its segments (sharded like the moments), casts each
  // updated segment into the compute copy, and under ZeRO-1 the all-gather carries the compute dtype.
  std::vector<OptimSegment> segments;
  int64_t state_numel = model.table().total_numel();
  if (zero) {
    state_numel = 0;
    for (int c = model.size() - 1; c >= 0; --c) {
      for (OptimSegment g : zero_segments(model.chunk(c).table(), *reducers[c])) {
        g.offset += model.base(c);
        g.state_offset += state_numel;
        segments.push_back(g);
      }
      state_numel += reducers[c]->shard_numel();
    }
  } else {
    segments = param_segments(model.table());
  }
  if (model.tied_copy_is_head()) {
    // The gradient norm counts the tied embedding once: the first stage's copy.
    const ParamSpec& wte = model.chunk(tied).table()[model.tied_param()];
    const int64_t lo = model.base(tied) + wte.offset, hi = lo + wte.numel();
    for (OptimSegment& g : segments)
      if (g.offset >= lo && g.offset + g.numel <= hi) g.in_norm = false;
  }
  auto opt = std::make_unique<Optimizer>(segments, state_numel, DType::F32, dev, os, zero ? &dp : nullptr,
                                         tp_norm, mesh.pp() > 1 ? comms.pp.get() : nullptr, mixed);
  if (mixed) opt->load_masters(masters);
  if (host_masters) masters = Tensor();  // the optimizer (or the GPU copy) holds the weights from here on
  std::unique_ptr<LocalSGD> local;
  if (local_sgd) {
    LocalSGDSettings ls;
    ls.sync_every = cfg.optim.sync_every;
    ls.nesterov = cfg.optim.outer == OuterOptimizer::Nesterov;
    ls.outer_lr = cfg.optim.outer_lr;
    ls.outer_momentum = cfg.optim.outer_momentum;
    local = std::make_unique<LocalSGD>(ls, dp, model.params(), *opt);
    if (rank0)
      spdlog::info("local SGD: {} replicas step alone and average their parameters every {} steps ({}); outer "
                   "state {:.1f} MiB",
                   mesh.dp(), ls.sync_every,
                   ls.nesterov ? fmt::format("outer Nesterov SGD, lr {:g}, momentum {:g}", ls.outer_lr,
                                             ls.outer_momentum)
                               : "plain average",
                   local->state_bytes() / 1048576.0);
  }
  // fp16 multiplies the loss's gradient by the scaler's scale; fp32 and bf16 need no scaling.
  const bool fp16 = compute == DType::F16;
  LossScaler scaler = fp16 ? LossScaler::from_config(cfg.precision.loss_scale) : LossScaler(LossScalerSettings{false, 1.0});
  if (!fp16 && cfg.precision.loss_scale != "dynamic" && rank0)
    spdlog::warn("precision.loss_scale={} is ignored: loss scaling applies to precision.compute=fp16 only",
                 cfg.precision.loss_scale);
  const TestHooks hooks = TestHooks::from_env();

  // Resume: the newest complete checkpoint (run.resume: auto), a given one, or none. Its masters and moments,
  // laid out for this mesh whatever mesh wrote them, replace the initial state; the compute copy is their
  // rounding. Every rank reads the same checkpoint, so a bad one stops them all with exit status 2.
  const std::string ckpt_root = cfg.run.dir + "/checkpoints";
  const std::string resume_dir = cfg.run.resume == "none"   ? ""
                                 : cfg.run.resume == "auto" ? latest_checkpoint(ckpt_root)
                                                            : cfg.run.resume;
  int start_step = 1;
  int64_t nonfinite_skipped = 0;  // steps skipped under train.skip_nonfinite
  if (!resume_dir.empty()) {
    std::string error;
    CheckpointInfo info;
    const double l0 = trace_clock_us();
    try {
      if (dev == Device::CUDA)
        input_error("run.resume: found {}, and resuming is not available with device=cuda yet (docs/cuda.md); "
                    "set run.resume=none or use another run.dir", resume_dir);
      info = restore_checkpoint(resume_dir, cfg, model, *opt);
      if (fp16) scaler.restore(info.state.loss_scale, info.state.good_in_a_row, info.state.skipped_steps);
      nonfinite_skipped = info.state.nonfinite_skipped;
    } catch (const InputError& e) {
      error = e.what();
    }
    agree_on_setup(error, MPI_COMM_WORLD);
    start_step = int(info.state.step) + 1;
    spdlog::info("resumed from {} (step {}, written on {}) in {:.0f} ms", resume_dir, info.state.step, info.mesh,
                 (trace_clock_us() - l0) / 1000.0);
  }
  LRSchedule sched{cfg.optim.schedule, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps, cfg.train.steps};

  PipelineRunner runner(model, comms.pp.get(), cfg.parallel.schedule, n_micro, mb, T, prof);
  Tensor loss_sum = Tensor::zeros({1}, DType::F32, dev);
  Batcher train_batches(&data.train.tokens, T, gb, cfg.data.order, cfg.train.seed);
  Batcher val_batches(&data.val.tokens, T, gb, DataOrder::Sequential, cfg.train.seed);
  spdlog::info("precision: compute {}, gradients and master weights fp32, data-parallel reduction in {}{}",
               dtype_name(compute), dtype_name(cfg.precision.grad_reduce),
               fp16 ? (scaler.dynamic() ? fmt::format(", dynamic loss scale from {:g}", scaler.scale())
                                        : fmt::format(", fixed loss scale {:g}", scaler.scale()))
                    : "");
  spdlog::info("memory per rank: parameters {:.1f} MiB ({}), gradients {:.1f} MiB, optimizer state {:.1f} MiB ({} "
               "bytes){} ({} micro-batches of {} x {} tokens per step per rank)",
               model.params().nbytes() / 1048576.0, dtype_name(compute), model.grads().nbytes() / 1048576.0,
               opt->state_bytes() / 1048576.0, opt->state_bytes(),
               zero ? fmt::format(" (ZeRO-1: this rank's 1/{} shard of the AdamW moments{})", mesh.dp(),
                                  mixed ? " and fp32 masters" : "")
                    : mixed ? " (AdamW moments and fp32 masters)" : "",
               n_micro, mb, T);
  std::unique_ptr<MetricsWriter> metrics;
  if (rank0) metrics = std::make_unique<MetricsWriter>(cfg.run.dir + "/metrics.jsonl", start_step - 1 > 0 ? start_step - 1 : -1);
  auto checkpoint = [&](int step) {
    const double t0 = trace_clock_us();
    const TrainState st{step,          opt->steps_taken(),          scaler.scale(), scaler.good_in_a_row(),
                        scaler.skipped_steps(), nonfinite_skipped};
    const std::string dir = write_checkpoint(ckpt_root, cfg, st, checkpoint_shard(model, *opt, mesh, zero), *comms.world,
                                             cfg.run.keep_checkpoints);
    spdlog::info("checkpoint: step {} written to {} in {:.0f} ms", step, dir, (trace_clock_us() - t0) / 1000.0);
  };
  // The whole model in one safetensors file from a flat fp32 buffer (parameters or gradients) of every rank.
  // The gather runs on host memory, so NCCL-backed meshes gather through MPI communicators made for it.
  auto export_safetensors = [&](const std::string& path, const Tensor& flat) {
    const Tensor host = to_host(flat);
    if (!nccl) return write_gathered_safetensors(path, model, host, mesh, comms, gcfg, stage_layers);
    MeshComms mpi = make_mesh_comms(mesh, MPI_COMM_WORLD, [&](MPI_Comm c, const std::string& name) {
      return make_communicator(c, name, copts);
    });
    write_gathered_safetensors(path, model, host, mesh, mpi, gcfg, stage_layers);
  };
  // Each rank's share of the mean: its tokens' gradients scaled by 1 / (its tokens); dp averages them.
  const double dloss = 1.0 / (double(local_batch) * T);
  const int64_t tokens_per_step = int64_t(gb) * T;
  // Exposed communication: compute blocked on collectives. Waits for pipeline neighbours are the bubble instead.
  auto wait_us = [&] {
    double w = 0;
    for (Communicator* c : {comms.world.get(), comms.dp.get(), comms.tp.get(), comms.emb.get()})
      if (c) w += c->total_wait_us();
    return w;
  };
  // CPU time of this rank's communication threads (comm_cpu_ms). Each communicator object once: a hierarchical
  // communicator's count already includes its sub-communicators, and an emulated one its inner transport's.
  std::vector<Communicator*> cpu_comms;
  for (Communicator* c : {comms.world.get(), comms.dp.get(), comms.tp.get(), comms.pp.get(), comms.emb.get()})
    if (c && std::find(cpu_comms.begin(), cpu_comms.end(), c) == cpu_comms.end()) cpu_comms.push_back(c);
  auto comm_cpu_us = [&] {
    double us = 0;
    for (Communicator* c : cpu_comms) us += c->thread_cpu_us();
    return us;
  };
  // The loss lives on the last stage, complete on each of its tp ranks: one of them contributes it.
  const bool loss_rank = mesh.is_last_stage() && mesh.tp_rank() == 0;
  Tensor loss_total = Tensor::zeros({1}, DType::F32);
  auto global_loss = [&]() {
    loss_total.data_as<float>()[0] = loss_rank ? float(read_scalar(loss_sum)) : 0.0f;
    if (world > 1) comms.world->all_reduce(loss_total, ReduceOp::Sum);
    return double(loss_total.data_as<float>()[0]);
  };
  // Evaluation: the mean loss over eval_batches global batches of the validation stream (the same windows each
  // time), each data-parallel rank taking its share, micro-batch by micro-batch through the pipeline.
  auto evaluate = [&]() {
    zero_(loss_sum);
    for (int b = 0; b < cfg.train.eval_batches; ++b)  // a batch per run: receive buffers for m micro-batches
      runner.forward_only(n_micro, [&](int j, int32_t* tok, int32_t* tgt) {
        val_batches.fill(b, int64_t(mesh.dp_rank()) * local_batch + int64_t(j) * mb, mb, tok, tgt);
      }, loss_sum);
    return global_loss() / (double(cfg.train.eval_batches) * gb * T);
  };
  // step, comm, exposed, pipeline span, -busy, MB sent, comm thread CPU: max over ranks
  Tensor times = Tensor::zeros({7}, DType::F32);
  double total_ms = 0, last_loss = 0, last_val = -1;
  uint64_t gpu_mallocs_after_first_step = 0;  // the caching allocator's cudaMalloc count once warm
  const auto run_start = Clock::now();
  if (start_step > cfg.train.steps)
    spdlog::info("nothing to train: the checkpoint is at step {}, train.steps is {}", start_step - 1, cfg.train.steps);
  for (int step = start_step; step <= cfg.train.steps; ++step) {
    const auto t0 = Clock::now();
    const double t0_us = trace_clock_us(), wait0 = wait_us(), cpu0 = comm_cpu_us();
    zero_(model.grads());
    zero_(loss_sum);
    timeline.take_bytes();  // evaluation traffic since the last step is not this step's
    if (step == hooks.grad_inf_step && mesh.rank() == world - 1) inject_grad_inf(model);
    const double loss_scale = scaler.scale();
    const RunStats rs = runner.train(
        [&](int m, int32_t* tok, int32_t* tgt) {
          train_batches.fill(step - 1, int64_t(mesh.dp_rank()) * local_batch + int64_t(m) * mb, mb, tok, tgt);
        },
        dloss * loss_scale, loss_sum, dp_reduce.hooks, cfg.comm.overlap);
    if (mesh.rank() == world - 1) maybe_fault(hooks, step);
    if (step == hooks.loss_nan_step && loss_rank && mesh.dp_rank() == mesh.dp() - 1) {
      float nan = std::numeric_limits<float>::quiet_NaN();
      copy_convert(loss_sum, Tensor(&nan, {1}, DType::F32));
    }
    if (tied >= 0) {
      // Sum the tied embedding's gradient between the first stage (embedding) and the last (head).
      const double w0 = trace_clock_us();
      comms.emb->all_reduce(model.chunk(tied).grad(model.tied_param()), ReduceOp::Sum);
      prof.wait("tied embedding", w0, trace_clock_us());
    }
    if (reducers[0]) {
      const double w0 = trace_clock_us();
      for (int c = model.size() - 1; c >= 0; --c) reducers[c]->finish();
      prof.wait("gradient buckets", w0, trace_clock_us());
    }
    if (step == 1 && !cfg.run.dump_grads.empty()) {
      if (zero) {
        if (rank0) spdlog::warn("run.dump_grads: skipped under ZeRO-1 (no rank holds the whole reduced gradient)");
      } else {
        export_safetensors(cfg.run.dump_grads, model.grads());
      }
    }
    const double lr = sched.at(step);
    // The loss over the whole global batch, the same on every rank.
    StepMetrics row;
    row.step = step;
    row.lr = lr;
    row.tokens = tokens_per_step * step;
    row.grad_norm = std::nan("");  // until the optimizer has computed it
    row.loss = global_loss() / double(tokens_per_step);
    const bool finite_loss = std::isfinite(row.loss);
    const double o0 = trace_clock_us();
    // Under ZeRO-1 its segments are this rank's shards. A non-finite loss or gradient norm (each the same on every
    // rank) leaves everything unchanged: in fp16 a gradient overflow makes the loss scaler back off and the step
    // count as skipped; otherwise train.skip_nonfinite skips and counts the step, or the run stops.
    const bool applied = finite_loss && opt->step(model.params(), model.grads(), lr, loss_scale);
    prof.compute("optimizer", o0, trace_clock_us());
    const bool overflow = fp16 && finite_loss && !applied;
    if (fp16 && (applied || overflow) && scaler.update(overflow) && rank0)
      spdlog::warn("step {}: gradient overflow (non-finite norm) at loss scale {:g}: step skipped, scale now {:g}",
                   step, loss_scale, scaler.scale());
    // Under local SGD each replica has its own gradient norm (the loss is global): without skip_nonfinite the run
    // stops when any replica's norm is non-finite, so that no replica waits alone in the next parameter average.
    const bool nonfinite = !applied && !overflow;
    const bool stop = !cfg.train.skip_nonfinite &&
                      (local_sgd && mesh.dp() > 1 ? any_rank(nonfinite, dp) : nonfinite);
    if (stop || nonfinite) {
      const std::string what = !finite_loss ? fmt::format("the loss became non-finite ({})", row.loss)
                               : nonfinite  ? std::string("the gradient norm became non-finite")
                                            : std::string("another replica's gradient norm became non-finite");
      if (stop) {
        if (metrics) metrics->write(row);
        const std::string kept = latest_checkpoint(ckpt_root);
        throw StoppedTogether(fmt::format("{} at step {} ({} compute); {}", what, step, dtype_name(compute),
                                          kept.empty() ? "no checkpoint was written"
                                                       : "the newest checkpoint is kept: " + kept));
      }
      ++nonfinite_skipped;
      if (rank0) spdlog::warn("step {}: {}: step skipped (train.skip_nonfinite)", step, what);
    }
    if (local && local->due(step, cfg.train.steps)) {
      const double s0 = trace_clock_us();
      local->sync(model.params(), *opt);
      prof.wait("local SGD parameter average", s0, trace_clock_us());
    }
    if (zero && applied) {
      const double g0 = trace_clock_us();
      for (int c = model.size() - 1; c >= 0; --c) reducers[c]->all_gather_params(model.chunk(c).params());
      prof.wait("all-gather parameters", g0, trace_clock_us());
    }
    const double cpu_ms = (comm_cpu_us() - cpu0) / 1000.0;  // inside the step's window: at most threads x step_ms
    const double step_ms = ms_since(t0);
    const double comm_ms = timeline.busy_ms(t0_us, trace_clock_us());
    const double exposed_ms = (wait_us() - wait0) / 1000.0;

    // Metrics: each time the maximum over ranks. The bubble of a stage is the pipeline phase's length (its
    // slowest stage) minus the stage's own compute in it.
    float* tm = times.data_as<float>();
    tm[0] = float(step_ms);
    tm[1] = float(comm_ms);
    tm[2] = float(exposed_ms);
    tm[3] = float(rs.span_ms);
    tm[4] = float(-rs.busy_ms);
    tm[5] = float(timeline.take_bytes() / 1048576.0);  // MiB: fp32 holds any step's traffic exactly enough
    tm[6] = float(std::max(0.0, cpu_ms));
    if (world > 1) comms.world->all_reduce(times, ReduceOp::Max);
    if (finite_loss) row.grad_norm = read_scalar(opt->grad_norm());
    row.step_ms = tm[0];
    row.comm_ms = tm[1];
    row.comm_cpu_ms = tm[6];
    row.exposed_comm_ms = tm[2];
    row.bubble_ms = mesh.pp() > 1 ? std::max(0.0f, tm[3] + tm[4]) : 0.0;
    row.compute_ms = std::max(0.0, row.step_ms - row.exposed_comm_ms - row.bubble_ms);
    row.tokens_per_s = tokens_per_step / (row.step_ms / 1000.0);
    row.comm_bytes = std::llround(double(tm[5]) * 1048576.0);
    if (fp16) row.loss_scale = loss_scale;
    if (fp16 || cfg.train.skip_nonfinite) row.skipped_steps = scaler.skipped_steps() + nonfinite_skipped;
    if (cfg.train.eval_every > 0 && (step % cfg.train.eval_every == 0 || step == cfg.train.steps)) {
      row.val_loss = evaluate();
      last_val = row.val_loss;
    }
    if (metrics) metrics->write(row);
    if (cfg.run.checkpoint_every > 0 && (step % cfg.run.checkpoint_every == 0 || step == cfg.train.steps))
      checkpoint(step);
    total_ms += row.step_ms;
    last_loss = row.loss;
    if (step == start_step) gpu_mallocs_after_first_step = device_memory_stats().driver_allocations;
    if (step % cfg.run.log_every == 0 || step == cfg.train.steps || step == 1) {
      const double eta_s = (cfg.train.steps - step) * (ms_since(run_start) / (step - start_step + 1)) / 1000.0;
      spdlog::info("step {:>5}/{} | loss {:.4f}{} | lr {:.3e} | grad norm {:.4f} | {:.0f} tok/s | {:.1f} ms/step{} | "
                   "ETA {}",
                   step, cfg.train.steps, row.loss, row.val_loss >= 0 ? fmt::format(" | val {:.4f}", row.val_loss) : "",
                   lr, row.grad_norm, row.tokens_per_s, row.step_ms,
                   world > 1 ? fmt::format(" (comm {:.1f}, comm cpu {:.1f}, exposed {:.1f}{})", row.comm_ms,
                                           row.comm_cpu_ms, row.exposed_comm_ms,
                                           mesh.pp() > 1 ? fmt::format(", bubble {:.1f}", row.bubble_ms) : "")
                             : "",
                   format_duration(eta_s));
    }
  }

  // The training's peak (of GPU memory for a GPU model), before the export gathers whole tensors.
  const size_t training_peak = dev == Device::CUDA ? device_memory_stats().peak : peak_host_tensor_bytes();
  if (dev == Device::CUDA) log_gpu_memory(runner, model.size(), gpu_mallocs_after_first_step);
  // The export holds the fp32 masters: gathered from the optimizer (under ZeRO-1 from every dp rank's shards).
  Tensor weights = model.params();
  if (mixed) {
    weights = Tensor::zeros(model.params().shape(), DType::F32, dev);
    opt->store_masters(weights);
    if (zero)
      for (int c = model.size() - 1; c >= 0; --c) reducers[c]->all_gather_params(model.chunk_view(weights, c));
  }
  export_safetensors(cfg.run.dir + "/model.safetensors", weights);
  if (rank0) model.chunk(0).export_hf_config(cfg.run.dir + "/config.json");
  if (prof.enabled()) {
    prof.write(cfg.run.dir + "/trace.json", MPI_COMM_WORLD);
    spdlog::info("profile: wrote {}/trace.json (open it in https://ui.perfetto.dev)", cfg.run.dir);
  }
  RankMemory mem;
  mem.params = double(model.params().nbytes());
  mem.grads = double(model.grads().nbytes());
  mem.optimizer = double(opt->state_bytes());
  for (int c = 0; c < model.size(); ++c) {
    mem.activations += double(runner.records(c) * runner.record_bytes(c));
    mem.records += double(runner.records(c));
  }
  mem.buffers = double(runner.buffer_bytes());
  mem.peak_tensors = double(training_peak);
  mem.peak_rss = peak_rss_bytes();
  report_memory(mem, mesh, *comms.world, cfg.run.dir + "/memory.json");
  const int steps_run = std::max(0, cfg.train.steps - start_step + 1);
  spdlog::info("done: {} steps{}, final loss {:.4f}{}, {:.0f} tok/s on average, peak RSS {:.1f} MiB; wrote "
               "{}/model.safetensors and config.json",
               steps_run, start_step > 1 ? fmt::format(" (from step {})", start_step) : "", last_loss,
               last_val >= 0 ? fmt::format(", val loss {:.4f}", last_val) : "",
               steps_run ? tokens_per_step * steps_run / (total_ms / 1000.0) : 0.0, peak_rss_bytes() / 1048576.0, cfg.run.dir);
}

}  // namespace

void run_training(const Config& cfg) {
  const bool gpu = cfg.device == Device::CUDA;
  if (gpu && !cuda_built())
    input_error("device=cuda: this build has no CUDA backend (nvcc and NCCL were not found when it was configured)");
  int world = 1, rank = 0;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  DeviceMesh mesh(resolved_dp(cfg, world), cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.order, world, rank);
  const NodeRanks node = node_ranks();
  const int on_node = node.local_size;
  if (gpu) {
    if (!cuda_available()) input_error("device=cuda: no usable GPU on this node");
    cuda_init(node.local_rank);
  }
  // NCCL needs a GPU of its own per rank; comm.backend=auto takes it when every rank on the node has one, and
  // MPI (device tensors staged through pinned host memory) otherwise, e.g. several ranks sharing one GPU.
  const bool nccl = gpu && (cfg.comm.backend == CommBackend::Nccl ||
                            (cfg.comm.backend == CommBackend::Auto && world > 1 && on_node <= cuda_device_count()));
  if (nccl && on_node > cuda_device_count())
    input_error("comm.backend=nccl: {} ranks on this node share {} GPUs; NCCL needs one GPU per rank (use "
                "comm.backend=mpi)", on_node, cuda_device_count());
  const int threads = cfg.train.threads > 0 ? cfg.train.threads : default_compute_threads(on_node);
  set_compute_threads(threads);
  const CommOptions copts = comm_options(cfg.comm, blocking_waits(cfg.comm, on_node, threads), gpu);
  // Declared before the communicators: their threads report into these until they are destroyed.
  CommTimeline timeline;
  Profiler prof(cfg.run.profile);
  // comm.hierarchical: every dp group must hold the same number of ranks on each emulated node. Checked for all
  // groups on every rank before any communicator exists, so no group is left waiting for one that refused.
  if (cfg.comm.hierarchical)
    for (int r = 0; r < world; ++r) {
      const HierarchicalLayout l =
          hierarchical_layout(emulated_nodes(mesh.group_members(MeshAxis::DP, r), cfg.comm.emulate.ranks_per_node), 0);
      if (!l.error.empty()) input_error("comm.hierarchical: the dp group of rank {}: {}", r, l.error);
    }
  // train.pin_threads, when the job's compute threads fill the node's cores, one each (a job that leaves cores
  // free may share the node with another, which would pin to the same first cores): the communication threads below
  // inherit this rank's cores (they then delay only this rank's compute), the compute threads get one each.
  const std::vector<int> cores = cfg.train.pin_threads && on_node * threads == omp_get_num_procs()
                                     ? rank_cores(node.local_rank * threads, threads)
                                     : std::vector<int>();
  bind_calling_thread(cores);
  // The world communicator carries host values (metrics, the loss): a host transport whatever the backend.
  MeshComms comms = make_mesh_comms(mesh, MPI_COMM_WORLD, [&](MPI_Comm c, const std::string& name) {
    if (name == "dp" && cfg.comm.hierarchical) return make_hierarchical_communicator(c, name, copts);
    if (nccl && name != "world") return make_device_communicator(c, name, copts);
    return make_communicator(c, name, copts);
  });
  // The communication threads, created above, have the rank's cores; now the compute threads get one each.
  if (!cores.empty()) {
    pin_compute_threads(cores);
    if (mesh.rank() == 0)
      spdlog::info("train.pin_threads: each rank's threads on cores of its own, one per compute thread (rank 0: "
                   "cpu {}{})", cores.front(), cores.size() > 1 ? fmt::format("-{}", cores.back()) : "");
  }
  for (Communicator* c : {comms.world.get(), comms.dp.get(), comms.tp.get(), comms.pp.get(), comms.emb.get()})
    if (c) c->set_event_sink([&](const CommEvent& e) {
      timeline.record(e);
      prof.comm(e);
    });
  try {
    train_on_mesh(cfg, mesh, comms, nccl, timeline, prof, copts, threads);
  } catch (const SetupError&) {
    throw;  // every rank is here together: communicators shut down cleanly, main exits with status 2
  } catch (const StoppedTogether&) {
    throw;  // likewise, exit status 1
  } catch (const std::exception& e) {
    // One rank failing leaves the others inside collectives: end the whole job now, before unwinding would
    // destroy communicators whose peers never finish their operations.
    if (world > 1) {
      spdlog::error("[rank {}] {}", rank, e.what());
      abort_job(dynamic_cast<const InputError*>(&e) ? 2 : 1);
    }
    throw;
  }
}

}  // namespace mt
