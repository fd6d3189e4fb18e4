// The step loop. Per step: zero gradients; for each of this data-parallel rank's micro-batches, forward (the
// loss's gradient scaled by 1 / tokens on this rank) and backward (gradients accumulate; during the last
// micro-batch, finished gradient buckets start their all-reduce (average over dp) or, under ZeRO-1, their
// reduce-scatter); wait for the buckets; clip and AdamW (under ZeRO-1 on this rank's shard, then all-gather);
// then the single read of device scalars (loss and gradient norm) for the log. Activations and scratch come
// from arenas sized by the first step, so steady-state steps allocate nothing.
#include "train/trainer.h"

#include <mpi.h>
#include <omp.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "comm/mpi_communicator.h"
#include "core/arena.h"
#include "core/errors.h"
#include "core/threads.h"
#include "data/batcher.h"
#include "model/gpt.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/grad_buckets.h"
#include "model/tp_shard.h"
#include "parallel/mesh.h"
#include "train/comm_timeline.h"
#include "train/dataset.h"
#include "train/metrics.h"
#include "train/profiler.h"
#include "train/zero_shards.h"

namespace mt {

namespace {

// Bad input found by every rank together (see agree_on_setup): the ranks exit with status 2 in step.
struct SetupError : InputError {
  using InputError::InputError;
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double read_scalar(const Tensor& t) {
  return t.dtype() == DType::F64 ? t.data_as<double>()[0] : t.data_as<float>()[0];
}

std::string format_duration(double seconds) {
  long s = std::lround(std::max(0.0, seconds));
  return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;  // ru_maxrss is in KiB on Linux
}

int ranks_on_this_node() {
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int n = 1;
  MPI_CHECK(MPI_Comm_size(node, &n));
  MPI_CHECK(MPI_Comm_free(&node));
  return n;
}

GPTConfig gpt_config(const ModelConfig& m) {
  GPTConfig g;
  g.n_layer = m.n_layer;
  g.n_head = m.n_head;
  g.d_model = m.d_model;
  g.seq_len = m.seq_len;
  g.vocab_size = m.vocab_size;
  return g;
}

// Mean loss over `batches` global batches of the validation stream (the same windows at every evaluation);
// each data-parallel rank evaluates its share of every batch.
double evaluate(const GPT& model, Activations& acts, Batcher& val, const Config& cfg, const Tensor& loss_sum,
                Communicator& dp) {
  zero_(loss_sum);
  const int mb = cfg.train.micro_batch, gb = cfg.train.global_batch, local = gb / dp.size();
  for (int b = 0; b < cfg.train.eval_batches; ++b)
    for (int first = 0; first < local; first += mb) {
      val.fill(b, int64_t(dp.rank()) * local + first, mb, acts.tokens.data_as<int32_t>(),
               acts.targets.data_as<int32_t>());
      model.forward(acts, 0.0, loss_sum);
    }
  dp.all_reduce(loss_sum, ReduceOp::Sum);
  return read_scalar(loss_sum) / (double(cfg.train.eval_batches) * gb * cfg.model.seq_len);
}

// comm.wait=auto: spinning waits pay off only when every compute thread of the node has a core of its own.
bool blocking_waits(const CommConfig& c, int ranks_on_node, int threads_per_rank) {
  if (c.wait != "auto") return c.wait == "block";
  return ranks_on_node * threads_per_rank <= omp_get_num_procs();
}

CommOptions comm_options(const CommConfig& c, bool blocking) {
  CommOptions o;
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
void train_on_mesh(const Config& cfg, const DeviceMesh& mesh, MeshComms& comms, CommTimeline& timeline,
                   Profiler& prof, const CommOptions& copts, int threads) {
  const int world = mesh.world_size();
  const bool rank0 = mesh.rank() == 0;
  Communicator& dp = *comms.dp;
  spdlog::info("{}, device {}, {} compute threads per rank, communication waits {}{}", mesh.describe(), cfg.device,
               threads, copts.blocking_waits ? "block" : "poll",
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
  GPT model(gcfg, DType::F32, Device::CPU);
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
    if (cfg.model.init_from.empty()) model.init(cfg.train.seed, cfg.model.init_std);
    else model.load_safetensors(cfg.model.init_from);
  } catch (const InputError& e) {
    setup_error = e.what();
  }
  agree_on_setup(setup_error, MPI_COMM_WORLD);
  spdlog::info("data: {}", data.train.description);
  if (data.entropy_rate_nats >= 0)
    spdlog::info("data: best achievable loss (entropy rate) {:.4f} nats; uniform guess ln(V) = {:.4f}",
                 data.entropy_rate_nats, std::log(double(cfg.model.vocab_size)));
  spdlog::info("model: GPT-2 L={} NH={} C={} T={} V={} (padded {}): {:.3f}M parameters{}", cfg.model.n_layer,
               cfg.model.n_head, cfg.model.d_model, T, cfg.model.vocab_size, model.vocab_padded(),
               model.num_parameters() / 1e6, cfg.model.init_from.empty() ? "" : ", from " + cfg.model.init_from);

  // Data parallelism: buckets over the flat gradient buffer; ZeRO-1 keeps only this rank's shards of the fp32
  // masters and moments.
  const bool zero = cfg.optim.zero == 1;
  std::unique_ptr<GradReducer> reducer;
  if (mesh.dp() > 1 || zero)
    reducer = std::make_unique<GradReducer>(
        dp, model.grads(),
        make_buckets(model.table(), model.table().total_numel(), dtype_size(DType::F32), cfg.comm.bucket_mb * 1048576.0),
        zero);
  OptimizerSettings os;
  os.beta1 = cfg.optim.beta1;
  os.beta2 = cfg.optim.beta2;
  os.eps = cfg.optim.eps;
  os.weight_decay = cfg.optim.weight_decay;
  os.grad_clip = cfg.train.grad_clip;
  // In fp32 the parameters are the master weights: under ZeRO-1 each rank updates its shards of them in place
  // and all-gathers the rest; only the moments are sharded (packed, 1/dp of the full optimizer's).
  std::unique_ptr<Optimizer> opt;
  if (zero) {
    opt = std::make_unique<Optimizer>(zero_segments(model.table(), *reducer), reducer->shard_numel(), DType::F32,
                                      Device::CPU, os, &dp, tp_norm);
  } else {
    opt = std::make_unique<Optimizer>(param_segments(model.table()), model.table().total_numel(), DType::F32,
                                      Device::CPU, os, nullptr, tp_norm);
  }
  LRSchedule sched{cfg.optim.schedule, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps, cfg.train.steps};

  Arena act_arena, scratch_arena;
  Activations acts = model.alloc_activations(act_arena, mb, T);
  Tensor loss_sum = Tensor::zeros({1}, DType::F32);
  Batcher train_batches(&data.train.tokens, T, gb, cfg.data.order, cfg.train.seed);
  Batcher val_batches(&data.val.tokens, T, gb, "sequential", cfg.train.seed);
  spdlog::info("memory per rank: parameters {:.1f} MiB, gradients {:.1f} MiB, optimizer state {:.1f} MiB ({} bytes){}, "
               "activations {:.1f} MiB per micro-batch ({} micro-batches of {} x {} tokens per step per rank)",
               model.params().nbytes() / 1048576.0, model.grads().nbytes() / 1048576.0,
               opt->state_bytes() / 1048576.0, opt->state_bytes(),
               zero ? fmt::format(" (ZeRO-1: this rank's 1/{} shard of the AdamW moments)", mesh.dp()) : "",
               act_arena.bytes_in_use() / 1048576.0, n_micro, mb, T);
  if (reducer)
    spdlog::info("data parallel: {} gradient buckets of up to {} MiB, {}, overlap {}", reducer->buckets().size(),
                 cfg.comm.bucket_mb, zero ? "reduce-scatter + all-gather (ZeRO-1)" : "all-reduce",
                 cfg.comm.overlap ? "on" : "off");

  std::unique_ptr<MetricsWriter> metrics;
  if (rank0) metrics = std::make_unique<MetricsWriter>(cfg.run.dir + "/metrics.jsonl");
  // Each rank's share of the mean: its tokens' gradients scaled by 1 / (its tokens); dp averages them.
  const double dloss = 1.0 / (double(local_batch) * T);
  const int64_t tokens_per_step = int64_t(gb) * T;
  const std::function<void(int64_t)> on_grads_ready = [&](int64_t end) { reducer->grads_ready(end); };
  auto wait_us = [&] {
    double w = 0;
    for (Communicator* c : {comms.world.get(), comms.dp.get(), comms.tp.get(), comms.pp.get()}) w += c->total_wait_us();
    return w;
  };
  Tensor times = Tensor::zeros({3}, DType::F32);  // step_ms, comm_ms, exposed_comm_ms: maximum over ranks
  double total_ms = 0, last_loss = 0, last_val = -1;
  const auto run_start = Clock::now();
  for (int step = 1; step <= cfg.train.steps; ++step) {
    const auto t0 = Clock::now();
    const double t0_us = trace_clock_us(), wait0 = wait_us();
    zero_(model.grads());
    zero_(loss_sum);
    for (int m = 0; m < n_micro; ++m) {
      train_batches.fill(step - 1, int64_t(mesh.dp_rank()) * local_batch + int64_t(m) * mb, mb,
                         acts.tokens.data_as<int32_t>(), acts.targets.data_as<int32_t>());
      const double f0 = trace_clock_us();
      model.forward(acts, dloss, loss_sum);
      const double b0 = trace_clock_us();
      prof.compute("forward", f0, b0);
      scratch_arena.reset();
      if (reducer) reducer->begin_micro_batch(m == n_micro - 1);
      model.backward(acts, scratch_arena, reducer && cfg.comm.overlap ? on_grads_ready : nullptr);
      prof.compute("backward", b0, trace_clock_us());
    }
    if (reducer) {
      const double w0 = trace_clock_us();
      reducer->finish();
      prof.wait("gradient buckets", w0, trace_clock_us());
    }
    if (step == 1 && !cfg.run.dump_grads.empty()) {
      if (zero) {
        if (rank0) spdlog::warn("run.dump_grads: skipped under ZeRO-1 (no rank holds the whole reduced gradient)");
      } else if (mesh.tp() == 1) {
        if (rank0) model.export_grads(cfg.run.dump_grads);
      } else if (mesh.dp_rank() == 0) {
        // The reduced step-1 gradients, gathered over tp exactly like the final parameter export: each shard's
        // gradients at its slice of the full tensor, the replicated ones (equal on every tp rank) from tp rank 0.
        const int tp = mesh.tp();
        const int64_t n = model.table().total_numel();
        Tensor all = Tensor::zeros({n * tp}, DType::F32);
        comms.tp->all_gather(model.grads(), all);
        if (mesh.tp_rank() == 0) {
          std::vector<const float*> by_rank;
          for (int r = 0; r < tp; ++r) by_rank.push_back(all.data_as<float>() + r * n);
          write_full_safetensors(cfg.run.dump_grads, model.table(), assemble_full(model.table(), by_rank));
        }
      }
    }
    const double lr = sched.at(step);
    const double o0 = trace_clock_us();
    opt->step(model.params(), model.grads(), lr);  // under ZeRO-1 its segments are this rank's shards
    prof.compute("optimizer", o0, trace_clock_us());
    if (zero) {
      const double g0 = trace_clock_us();
      reducer->all_gather_params(model.params());
      prof.wait("all-gather parameters", g0, trace_clock_us());
    }
    const double step_ms = ms_since(t0);
    const double comm_ms = timeline.busy_ms(t0_us, trace_clock_us());
    const double exposed_ms = (wait_us() - wait0) / 1000.0;

    // Metrics: the loss over the whole global batch, and each time the maximum over ranks.
    if (mesh.dp() > 1) dp.all_reduce(loss_sum, ReduceOp::Sum);
    times.data_as<float>()[0] = float(step_ms);
    times.data_as<float>()[1] = float(comm_ms);
    times.data_as<float>()[2] = float(exposed_ms);
    if (world > 1) comms.world->all_reduce(times, ReduceOp::Max);
    StepMetrics row;
    row.step = step;
    row.loss = read_scalar(loss_sum) / double(tokens_per_step);
    row.grad_norm = read_scalar(opt->grad_norm());
    row.lr = lr;
    row.tokens = tokens_per_step * step;
    row.step_ms = times.data_as<float>()[0];
    row.comm_ms = times.data_as<float>()[1];
    row.exposed_comm_ms = times.data_as<float>()[2];
    row.compute_ms = row.step_ms - row.exposed_comm_ms;
    row.tokens_per_s = tokens_per_step / (row.step_ms / 1000.0);
    if (!std::isfinite(row.loss)) {
      if (metrics) metrics->write(row);
      throw std::runtime_error(fmt::format("the loss became non-finite ({}) at step {}", row.loss, step));
    }
    if (cfg.train.eval_every > 0 && (step % cfg.train.eval_every == 0 || step == cfg.train.steps)) {
      row.val_loss = evaluate(model, acts, val_batches, cfg, loss_sum, dp);
      last_val = row.val_loss;
    }
    if (metrics) metrics->write(row);
    total_ms += row.step_ms;
    last_loss = row.loss;
    if (step % cfg.run.log_every == 0 || step == cfg.train.steps || step == 1) {
      const double eta_s = (cfg.train.steps - step) * (ms_since(run_start) / step) / 1000.0;
      spdlog::info("step {:>5}/{} | loss {:.4f}{} | lr {:.3e} | grad norm {:.4f} | {:.0f} tok/s | {:.1f} ms/step{} | "
                   "ETA {}",
                   step, cfg.train.steps, row.loss, row.val_loss >= 0 ? fmt::format(" | val {:.4f}", row.val_loss) : "",
                   lr, row.grad_norm, row.tokens_per_s, row.step_ms,
                   world > 1 ? fmt::format(" (comm {:.1f}, exposed {:.1f})", row.comm_ms, row.exposed_comm_ms) : "",
                   format_duration(eta_s));
    }
  }

  if (mesh.tp() == 1) {
    if (rank0) model.export_safetensors(cfg.run.dir + "/model.safetensors");
  } else if (mesh.dp_rank() == 0) {
    // Gather every tp rank's flat parameter buffer (equal sizes) to the dp_rank 0 group and write the full tensors.
    const int tp = mesh.tp();
    const int64_t n = model.table().total_numel();
    Tensor all = Tensor::zeros({n * tp}, DType::F32);
    comms.tp->all_gather(model.params(), all);
    if (mesh.tp_rank() == 0) {
      std::vector<const float*> by_rank;
      for (int r = 0; r < tp; ++r) by_rank.push_back(all.data_as<float>() + r * n);
      write_full_safetensors(cfg.run.dir + "/model.safetensors", model.table(), assemble_full(model.table(), by_rank));
    }
  }
  if (rank0) model.export_hf_config(cfg.run.dir + "/config.json");
  if (prof.enabled()) {
    prof.write(cfg.run.dir + "/trace.json", MPI_COMM_WORLD);
    spdlog::info("profile: wrote {}/trace.json (open it in https://ui.perfetto.dev)", cfg.run.dir);
  }
  spdlog::info("done: {} steps, final loss {:.4f}{}, {:.0f} tok/s on average, peak RSS {:.1f} MiB, activation "
               "arena {:.1f} MiB ({} block allocations); wrote {}/model.safetensors and config.json",
               cfg.train.steps, last_loss, last_val >= 0 ? fmt::format(", val loss {:.4f}", last_val) : "",
               tokens_per_step * cfg.train.steps / (total_ms / 1000.0), peak_rss_mib(),
               (act_arena.bytes_reserved() + scratch_arena.bytes_reserved()) / 1048576.0,
               act_arena.block_allocations() + scratch_arena.block_allocations(), cfg.run.dir);
}

}  // namespace

void run_training(const Config& cfg) {
  // Valid names that later versions implement: refuse them up front rather than train something else.
  if (cfg.precision.compute != "fp32")
    input_error("precision.compute={}: this version trains in fp32 only (mixed precision is not built yet)",
                cfg.precision.compute);
  if (cfg.device != "cpu") input_error("device={}: this build has no CUDA backend; use device=cpu", cfg.device);
  if (cfg.parallel.pp != 1)
    input_error("parallel.pp={}: pipeline parallelism is not built yet; use dp and tp only", cfg.parallel.pp);
  if (cfg.comm.backend == "nccl") input_error("comm.backend=nccl needs device=cuda");
  if (cfg.run.checkpoint_every != 0)
    input_error("run.checkpoint_every={}: checkpoints are not built yet", cfg.run.checkpoint_every);
  if (cfg.run.resume != "auto" && cfg.run.resume != "none")
    input_error("run.resume={}: checkpoints are not built yet; use auto or none", cfg.run.resume);

  int world = 1, rank = 0;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  DeviceMesh mesh(resolved_dp(cfg, world), cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.order, world, rank);
  const int node_ranks = ranks_on_this_node();
  const int threads = cfg.train.threads > 0 ? cfg.train.threads : default_compute_threads(node_ranks);
  set_compute_threads(threads);
  const CommOptions copts = comm_options(cfg.comm, blocking_waits(cfg.comm, node_ranks, threads));
  // Declared before the communicators: their threads report into these until they are destroyed.
  CommTimeline timeline;
  Profiler prof(cfg.run.profile);
  MeshComms comms = make_mesh_comms(mesh, MPI_COMM_WORLD, [&](MPI_Comm c, const std::string& name) {
    return make_mpi_communicator(c, name, copts);
  });
  for (Communicator* c : {comms.world.get(), comms.dp.get(), comms.tp.get(), comms.pp.get()})
    c->set_event_sink([&](const CommEvent& e) {
      timeline.record(e);
      prof.comm(e);
    });
  try {
    train_on_mesh(cfg, mesh, comms, timeline, prof, copts, threads);
  } catch (const SetupError&) {
    throw;  // every rank is here together: communicators shut down cleanly, main exits with status 2
  } catch (const std::exception& e) {
    // One rank failing leaves the others inside collectives: end the whole job now, before unwinding would
    // destroy communicators whose peers never finish their operations.
    if (world > 1) {
      spdlog::error("[rank {}] {}", rank, e.what());
      MPI_Abort(MPI_COMM_WORLD, dynamic_cast<const InputError*>(&e) ? 2 : 1);
    }
    throw;
  }
}

}  // namespace mt
