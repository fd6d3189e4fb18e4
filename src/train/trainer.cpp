// The step loop: builds the run on an established mesh (training_run.h), then per step train_step (train_step.h),
// the step's metrics over the ranks (step_report.h), evaluation and checkpoints; at the end the export. run_training
// sets up what the run stands on: the mesh, the compute threads and the communicators.
#include "train/trainer.h"

#include <mpi.h>
#include <unistd.h>
#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>

#include "comm/comm_util.h"
#include "comm/flight_recorder.h"
#include "comm/hierarchical_communicator.h"
#include "comm/make_communicator.h"
#include "comm/mpi_init.h"
#include "comm/nccl_communicator.h"
#include "comm/realtime_threads.h"
#include "core/device.h"
#include "core/errors.h"
#include "core/json.h"
#include "core/threads.h"
#include "parallel/grad_compress.h"
#include "train/comm_timeline.h"
#include "train/copies_check.h"
#include "train/run_dir.h"
#include "train/memory_report.h"
#include "train/link_schedule.h"
#include "train/metrics.h"
#include "train/profiler.h"
#include "train/step_report.h"
#include "train/stop_signal.h"
#include "train/train_step.h"
#include "train/training_run.h"

namespace mt {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

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
// records, and whether the steps after the first allocated from the driver (they should not); then how often the
// host waited for the GPU in those steps.
void log_gpu_memory(const PipelineRunner& runner, int chunks, uint64_t mallocs_after_first_step,
                    uint64_t waits_after_first_step, int steps_after_first) {
  const DeviceMemoryStats s = device_memory_stats();
  double records = 0;
  for (int c = 0; c < chunks; ++c) records += double(runner.records(c) * runner.record_bytes(c));
  spdlog::info("GPU memory: peak {:.1f} MiB in tensors (activation records {:.1f} MiB), {:.1f} MiB held from the "
               "driver in {} cudaMalloc calls, {} of them after the first step",
               s.peak / 1048576.0, records / 1048576.0, s.reserved / 1048576.0, s.driver_allocations,
               s.driver_allocations - mallocs_after_first_step);
  if (steps_after_first > 0) {
    const uint64_t waits = device_host_waits() - waits_after_first_step;
    spdlog::info("host waits for the GPU: {} in the {} steps after the first, {:.2f} per step (the loss and the "
                 "gradient norm are 2; evaluations and checkpoints add theirs)",
                 waits, steps_after_first, double(waits) / steps_after_first);
  }
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

// comm.thread_priority: whether the communication threads that never spin run real-time (comm/realtime_threads.h).
// auto takes it where the OS permits it; realtime refuses to start without it. Collective over the world, so that a
// refusal on one node ends the job on every rank (exit 2) instead of leaving the others waiting for it.
bool realtime_comm_threads(CommThreadPriority want, int local_rank) {
  if (want == CommThreadPriority::Normal) return false;
  std::string why;
  const int mine = realtime_threads_permitted(&why) ? 1 : 0;
  const int all = allreduce_int_yielding(mine, MPI_MIN, MPI_COMM_WORLD);
  if (want == CommThreadPriority::Realtime && !all)
    input_error("comm.thread_priority=realtime: {}", mine ? "another rank's node refuses real-time threads"
                : fmt::format("this process may not run real-time threads ({}); grant CAP_SYS_NICE or an rtprio "
                              "limit of at least 1 (ulimit -r, docs/comm.md), or set comm.thread_priority=auto",
                              why));
  if (!mine && local_rank == 0)
    spdlog::warn("comm.thread_priority=auto: real-time threads refused on this node ({}); communication threads run "
                 "at normal priority, and hide less of the communication when every core computes (docs/comm.md)",
                 why);
  return mine;
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


// comm.emulate.schedule before step `step`: every emulated communicator of the mesh takes the schedule's link for
// this step (at the first step of a run, or of a resumed one, the latest entry at or before it).
void apply_link_schedule(const std::vector<LinkChange>& schedule, int step, bool first_step, MeshComms& comms,
                         bool log) {
  const LinkChange* now = nullptr;
  for (const LinkChange& c : schedule)
    if (c.step == step || (first_step && c.step <= step)) now = &c;
  if (!now) return;
  for (Communicator* c : comms.all()) c->set_emulated_link(now->latency_us, now->bandwidth_gbps);
  if (log)
    spdlog::info("comm.emulate.schedule: from step {} the emulated link is {:g} us / {:g} GB/s", now->step,
                 now->latency_us, now->bandwidth_gbps);
}

// The real node of each of `world_ranks`.
std::vector<int> nodes_of(const std::vector<int>& world_ranks, const NodeRanks& node) {
  std::vector<int> out;
  for (int r : world_ranks) out.push_back(node.node_of[static_cast<size_t>(r)]);
  return out;
}

// The hosts and their ranks, and which mesh axes keep their groups inside a host (docs/multinode.md): tensor
// parallelism exchanges activations every layer, so a tp group spanning hosts is worth a warning.
void log_nodes(const DeviceMesh& mesh, const NodeRanks& node) {
  spdlog::info("{}", node.describe());
  if (node.nodes == 1) return;
  auto spans_nodes = [&](MeshAxis a) {
    for (int r = 0; r < mesh.world_size(); ++r) {
      const std::vector<int> n = nodes_of(mesh.group_members(a, r), node);
      if (std::any_of(n.begin(), n.end(), [&](int x) { return x != n.front(); })) return true;
    }
    return false;
  };
  std::string inside, across;
  for (MeshAxis a : {MeshAxis::TP, MeshAxis::CP, MeshAxis::DP, MeshAxis::PP}) {
    if (mesh.group_members(a, 0).size() < 2) continue;
    std::string& list = spans_nodes(a) ? across : inside;
    list += (list.empty() ? "" : ", ") + std::string(mesh_axis_name(a));
  }
  spdlog::info("mesh over nodes: groups inside a node: {}; groups spanning nodes: {}", inside.empty() ? "none" : inside,
               across.empty() ? "none" : across);
  if (mesh.tp() > 1 && spans_nodes(MeshAxis::TP))
    spdlog::warn("tensor-parallel groups span nodes: their exchanges in every layer cross the network; "
                 "parallel.order with tp first (tp-dp-pp, the default) keeps them inside a node when each node's "
                 "ranks are consecutive");
}

// run.stop_signals: armed where the run can write a checkpoint; null where not (the signals then end it at once).
std::unique_ptr<StopVote> arm_stop_signals(const Config& cfg, const TrainingRun& run, Communicator* world, bool log) {
  std::vector<int> signals;
  std::string bad;
  parse_stop_signals(cfg.run.stop_signals, signals, bad);  // validated with the config
  if (signals.empty()) return nullptr;
  const int lag = stop_vote_lag(cfg.optim.sync_every, cfg.optim.staleness);
  if (log && run.dp->checkpoints_wait_for_average())
    spdlog::info("run.stop_signals: under local SGD a signal stops the run within {} steps; a checkpoint between "
                 "two averages holds every replica's weights", lag);
  install_stop_signals(signals);
  return std::make_unique<StopVote>(world, lag);
}

// After a step's report: whether the run stops here for a signal. Once every rank knows of it, the run stops at
// the first step where its checkpoint can hold the replicas' state: every step, except under optim.staleness,
// where the signal makes the next step a sync point (every replica then holds the same weights); a signal during
// the last step changes nothing.
bool stop_now(StopVote& vote, int& signal, bool checkpointable, int step, int last_step) {
  if (!signal) signal = vote.cast();
  return signal && checkpointable && step < last_step;
}

// How a run ended, for run.dir/status.json (rank 0's view).
struct RunEnd {
  std::vector<std::string> fields;
};

// The run on an established mesh. Kept apart from run_training so that the communicators outlive an exception
// until every rank has been told to stop (see run_training).
RunEnd train_on_mesh(const Config& cfg, const DeviceMesh& mesh, MeshComms& comms, bool nccl, CommTimeline& timeline,
                   Profiler& prof, const CommOptions& copts, int threads, bool node_leader) {
  const int world = mesh.world_size();
  const bool rank0 = mesh.rank() == 0;
  spdlog::info("{}, device {}{}, {} compute threads per rank, communication {}{}{}", mesh.describe(),
               name_of(cfg.device),
               cfg.device == Device::CUDA ? fmt::format(" (GPU {} of this node)", cuda_device_index()) : "", threads,
               nccl ? "nccl" : transport_description(copts),
               copts.realtime_threads ? " (real-time threads)" : "",
               copts.emulating() ? fmt::format(", emulated network {} us / {} GB/s", copts.latency_us,
                                               copts.bandwidth_gbps)
                                 : "");
  if (rank0 && world > 1) spdlog::info("mesh ranks:\n{}", mesh.table());
  std::unique_ptr<TrainingRun> built = build_training_run(cfg, mesh, comms, nccl, copts, prof);
  TrainingRun& run = *built;
  std::unique_ptr<MetricsWriter> metrics;
  if (rank0) metrics = std::make_unique<MetricsWriter>(cfg.run.dir + "/metrics.jsonl", run.start_step - 1 > 0 ? run.start_step - 1 : -1);
  StepMeter meter(run, timeline, node_leader);
  // Energy per step where every node has RAPL counters; else the log says where they are missing, once.
  if (meter.energy() && !meter.energy()->available())
    spdlog::info("energy: unavailable on this node ({}): metrics.jsonl has no energy_j",
                 meter.energy()->why_unavailable());
  if (const GpuEnergyMeter* g = meter.gpu_energy())
    spdlog::info(g->available() ? fmt::format("GPU energy: NVML counters of the node's {} GPU(s), metrics.jsonl's "
                                              "gpu_energy_j", g->gpus())
                                : fmt::format("GPU energy: unavailable on this node ({}): metrics.jsonl has no "
                                              "gpu_energy_j", g->why_unavailable()));
  double total_ms = 0, last_elapsed_ms = 0, last_loss = 0, last_val = -1;
  uint64_t gpu_mallocs_after_first_step = 0;  // the caching allocator's cudaMalloc count once warm
  uint64_t gpu_waits_after_first_step = 0;    // and the host's waits for the GPU by then
  const auto run_start = Clock::now();
  const int start_step = run.start_step;
  if (start_step > cfg.train.steps)
    spdlog::info("the run was already complete at step {} (train.steps is {}): nothing to train; the export is "
                 "written again from that checkpoint", start_step - 1, cfg.train.steps);
  auto due = [&](int every, int step) { return every > 0 && (step % every == 0 || step == cfg.train.steps); };
  int checkpointed = 0;  // the step of the newest checkpoint this run wrote
  // Local SGD: a checkpoint falls due at any step but is written at the next parameter average (where the replicas
  // share their weights), so that checkpoints never change when the replicas meet.
  const bool checkpoint_at_average = run.dp->checkpoints_wait_for_average();
  bool checkpoint_due = false;
  // run.check_copies_every: due every that many steps, compared at the first row from there whose step left the
  // copies equal by design (`copies_agree_at`: every step in lockstep; local SGD's averages; optim.staleness's sync
  // points), after its row is written and before its checkpoint. The end compares them anyway.
  bool copies_due = false, copies_logged = false;
  int copies_agree_at = 0;
  auto check_copies = [&](int step) {
    copies_due |= due(cfg.run.check_copies_every, step);
    if (!copies_due || step != copies_agree_at || step == cfg.train.steps) return;
    copies_due = false;
    const auto t0 = Clock::now();
    const std::string line = check_weight_copies(run, step);
    if (rank0 && !copies_logged && !line.empty())
      spdlog::info("{} ({:.1f} ms; run.check_copies_every={}, the next checks log only a difference)", line,
                   ms_since(t0), cfg.run.check_copies_every);
    copies_logged = true;
  };
  // A step's row once its figures are complete: evaluation and checkpoint when due, metrics.jsonl, the log.
  // `averaged`: the step ended with local SGD's parameter average.
  auto report = [&](StepMetrics& row, bool averaged) {
    const int step = int(row.step);
    if (due(cfg.train.eval_every, step)) {
      row.val_loss = evaluate(run);
      last_val = row.val_loss;
    }
    if (metrics) metrics->write(row);
    check_copies(step);
    checkpoint_due |= due(cfg.run.checkpoint_every, step);
    if (checkpoint_due && (averaged || !checkpoint_at_average)) {
      checkpoint_run(run, step), checkpointed = step, checkpoint_due = false;
      if (step != cfg.train.steps && !due(cfg.run.checkpoint_every, step))
        spdlog::info("checkpoint: due at step {}, written at the parameter average of step {}",
                     step - step % cfg.run.checkpoint_every, step);
    }
    total_ms += row.step_ms;
    last_elapsed_ms = row.elapsed_ms;
    last_loss = row.loss;
    if (step == start_step) {
      gpu_mallocs_after_first_step = device_memory_stats().driver_allocations;
      gpu_waits_after_first_step = device_host_waits();
    }
    if (step % cfg.run.log_every == 0 || step == cfg.train.steps || step == 1) {
      const double eta_s = (cfg.train.steps - step) * (ms_since(run_start) / (step - start_step + 1)) / 1000.0;
      log_step(row, cfg.train.steps, world > 1, mesh.pp() > 1, eta_s);
    }
  };
  // Replicas not in lockstep: a row completed in the background, then comm.adapt's observation of it.
  auto report_late = [&](StepMetrics& row, const AdaptSample& sample, bool synced) {
    if (run.dp->adapts()) run.dp->adapt_after_step(run, int(row.step), synced, sample, row);
    report(row, synced);
  };
  PendingRows pending(meter, world > 1 ? comms.world.get() : nullptr, timeline);
  const std::vector<LinkChange> link_schedule = parse_link_schedule(cfg.comm.emulate.schedule);
  std::unique_ptr<StopVote> stop_vote = arm_stop_signals(cfg, run, world > 1 ? comms.world.get() : nullptr, rank0);
  int stop_signal = 0;   // agreed by every rank: stop with a checkpoint at the next step where the replicas agree
  int stopped_at = 0;
  for (int step = start_step; step <= cfg.train.steps; ++step) {
    // Evaluations, checkpoints and the end need every replica's weights alike (optim.staleness applies every
    // average still in flight there).
    const bool sync_point = step == cfg.train.steps || due(cfg.train.eval_every, step) ||
                            (due(cfg.run.checkpoint_every, step) && !checkpoint_at_average) || stop_signal != 0;
    apply_link_schedule(link_schedule, step, step == start_step, comms, rank0);
    meter.begin();
    const StepResult s = train_step(run, step, sync_point, prof);
    StepMetrics row;
    row.step = step;
    row.lr = s.lr;
    row.tokens = run.tokens_per_step * step;
    row.grad_norm = std::nan("");  // until the optimizer has computed it
    row.loss = s.loss;
    if (!s.stop.empty()) {
      pending.flush(true, report_late);  // every rank stops at this step, with the same rows in flight
      if (metrics) metrics->write(row);
      throw StoppedTogether(s.stop);
    }
    row.grad_norm = s.grad_norm;
    if (run.fp16) row.loss_scale = s.loss_scale;
    // Written where steps can be skipped (fp16, skip_nonfinite, the averages optim.staleness skips for a non-finite
    // norm): the count, the most any rank skipped, comes with the step's figures (StepMeter::fill_row).
    if (run.fp16 || cfg.train.skip_nonfinite || cfg.optim.staleness > 0) row.skipped_steps = 0;
    copies_agree_at = run.dp->lockstep() || s.synced || (sync_point && !checkpoint_at_average) ? step : 0;
    if (!run.dp->lockstep()) {
      pending.add(row, meter.measure(s), s.synced);
      // comm.adapt decides at local SGD's averages: every rank completes every row up to one there.
      pending.flush(sync_point || s.synced, report_late);
      // Local SGD's checkpoint holds each replica's weights between averages; staleness's needs a sync point.
      const bool checkpointable = checkpoint_at_average || sync_point || s.synced;
      if (stop_vote && stop_now(*stop_vote, stop_signal, checkpointable, step, cfg.train.steps)) {
        pending.flush(true, report_late);  // every row up to the checkpoint's step, on every rank alike
        stopped_at = step;
        break;
      }
      continue;
    }
    AdaptSample sample;
    const bool adapting = run.dp->adapts();
    meter.end(s, row, adapting ? &sample : nullptr);
    if (adapting) run.dp->adapt_after_step(run, step, s.synced, sample, row);
    report(row, s.synced);
    if (stop_vote && stop_now(*stop_vote, stop_signal, true, step, cfg.train.steps)) {
      stopped_at = step;
      break;
    }
  }
  if (stopped_at) {
    if (checkpointed != stopped_at) checkpoint_run(run, stopped_at);
    const double since = seconds_since_stop_signal();  // 0 where this rank was not signalled itself
    spdlog::info("stopped by {} after step {} of {}{}; the checkpoint of step {} is written: the same command "
                 "continues from it (run.resume=auto)", signal_name(stop_signal), stopped_at, cfg.train.steps,
                 since > 0 ? fmt::format(", {:.2f} s after the signal", since) : "", stopped_at);
    return {{"\"state\": \"stopped\"", fmt::format("\"step\": {}", stopped_at),
             fmt::format("\"signal\": {}", json_quote(signal_name(stop_signal))),
             fmt::format("\"checkpoint\": {}", json_quote(fmt::format("{}/checkpoints/step_{:08d}", cfg.run.dir,
                                                                         stopped_at))),
             "\"exit_code\": 0"}};
  }

  // The training's peak (of GPU memory for a GPU model), before the export gathers whole tensors.
  const size_t training_peak = run.dev == Device::CUDA ? device_memory_stats().peak : peak_host_tensor_bytes();
  if (run.dev == Device::CUDA)
    log_gpu_memory(*run.runner, run.model->size(), gpu_mallocs_after_first_step, gpu_waits_after_first_step,
                   cfg.train.steps - start_step);
  finish_run(run, training_peak);
  if (prof.enabled()) {
    prof.write(cfg.run.dir + "/trace.json", MPI_COMM_WORLD);
    spdlog::info("profile: wrote {}/trace.json (open it in https://ui.perfetto.dev)", cfg.run.dir);
  }
  const int steps_run = std::max(0, cfg.train.steps - start_step + 1);
  const RunEnd end{{"\"state\": \"completed\"", fmt::format("\"step\": {}", std::max(cfg.train.steps, start_step - 1)),
                    fmt::format("\"steps_trained\": {}", steps_run), "\"exit_code\": 0"}};
  if (steps_run == 0) {
    spdlog::info("done: the run was already complete at step {}; trained nothing, wrote {}/model.safetensors and "
                 "config.json again from its checkpoint", start_step - 1, cfg.run.dir);
    return end;
  }
  spdlog::info("done: {} steps{}, final loss {:.4f}{}, {:.0f} tok/s on average, peak RSS {:.1f} MiB; wrote "
               "{}/model.safetensors and config.json",
               steps_run, start_step > 1 ? fmt::format(" (from step {})", start_step) : "", last_loss,
               last_val >= 0 ? fmt::format(", val loss {:.4f}", last_val) : "",
               // Replicas at different steps (optim.staleness): the run's wall time, not the sum of the slowest
               // rank's step times.
               steps_run
                   ? run.tokens_per_step * steps_run / ((run.dp->lockstep() ? total_ms : last_elapsed_ms) / 1000.0)
                   : 0.0,
               peak_rss_bytes() / 1048576.0,
               cfg.run.dir);
  return end;
}

}  // namespace

void run_training(const Config& cfg) {
  const bool gpu = cfg.device == Device::CUDA;
  if (gpu && !cuda_built())
    input_error("device=cuda: this build has no CUDA backend (nvcc and NCCL were not found when it was configured)");
  int world = 1, rank = 0;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  DeviceMesh mesh(resolved_dp(cfg, world), cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.order, world, rank,
                  cfg.parallel.cp);
  const NodeRanks node = node_ranks();
  const int on_node = node.local_size;
  if (rank == 0 && world > 1) log_nodes(mesh, node);
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
  // The three phases run on the host transports' sub-communicators (device tensors staged through host memory);
  // over NCCL they would have to chain on NCCL's streams, which is not built. comm.backend=nccl is refused with the
  // config; here auto has chosen NCCL.
  if (nccl && cfg.comm.hierarchical)
    input_error("comm.hierarchical is not available over NCCL yet (comm.backend=auto chose NCCL: every rank has a GPU "
                "of its own); set comm.backend=mpi for the three-phase all-reduce of device tensors (staged through "
                "host memory), or comm.hierarchical=false");
  const int threads = cfg.train.threads > 0 ? cfg.train.threads : default_compute_threads(on_node);
  set_compute_threads(threads);
  // More compute threads than the node's cores, asked for (ranks alone beyond the cores get one thread each):
  // every parallel region then waits for a thread that is off its core.
  if (rank == 0 && !gpu && threads > 1 && on_node * threads > omp_get_num_procs())
    spdlog::warn("{}={} with {} rank(s) on this node: {} compute threads take turns on its {} cores, and each parallel "
                 "region waits for the one off its core (configs/gpt.yaml on 2 cores: 1.5-1.8x slower at 3 to 8 "
                 "threads than at 2); train.threads=0 (without OMP_NUM_THREADS) gives each rank cores / ranks",
                 cfg.train.threads > 0 ? "train.threads" : "OMP_NUM_THREADS", threads, on_node, on_node * threads,
                 omp_get_num_procs());
  {
    kernels::cpu::MatmulBackends backends;
    std::string unused;  // validate() refused a choice this build cannot run
    kernels::cpu::resolve_matmul_backends(cfg.train.cpu_matmul, backends, unused);
    kernels::cpu::set_matmul_backends(backends);
    if (rank == 0 && cfg.device == Device::CPU) {
      spdlog::info("train.cpu_matmul={}: {}", name_of(cfg.train.cpu_matmul), kernels::cpu::describe(backends));
      // A 16-bit run that gains no matmul speed on this CPU says so, rather than leaving the user to find out.
      const char* saves =
          "16-bit halves the activations and the weights' compute copy here, but does not speed up the matmuls";
      if (cfg.precision.compute == DType::BF16 && backends.bf16 == kernels::cpu::MatmulLibrary::Eigen)
        spdlog::info("precision.compute=bf16: the matmuls widen to fp32 ({}); {}",
                     kernels::cpu::bf16_widening_reason(cfg.train.cpu_matmul), saves);
      if (cfg.precision.compute == DType::F16)
        spdlog::info("precision.compute=fp16: the matmuls widen to fp32 on the CPU (oneDNN 2.6 has no fp16 CPU "
                     "kernels); {}", saves);
    }
  }
  CommOptions copts = comm_options(cfg.comm, blocking_waits(cfg.comm, on_node, threads), gpu);
  copts.realtime_threads = realtime_comm_threads(cfg.comm.thread_priority, node.local_rank);
  // Declared before the communicators: their threads report into these until they are destroyed.
  CommTimeline timeline;
  Profiler prof(cfg.run.profile);
  // comm.hierarchical: every dp group must hold the same number of ranks on each node (emulated, or as MPI finds them). Checked for all
  // groups on every rank before any communicator exists, so no group is left waiting for one that refused.
  if (cfg.comm.hierarchical)
    for (int r = 0; r < world; ++r) {
      const std::vector<int> members = mesh.replica_members(r);
      const HierarchicalLayout l = hierarchical_layout(
          cfg.comm.emulate.ranks_per_node > 0 ? emulated_nodes(members, cfg.comm.emulate.ranks_per_node)
                                              : nodes_of(members, node),
          0);
      if (!l.error.empty()) input_error("comm.hierarchical: the dp group of rank {}: {}", r, l.error);
      if (r == 0 && rank == 0)
        spdlog::info("comm.hierarchical: each dp all-reduce over {} nodes x {} ranks ({})", l.nodes, l.ranks_per_node,
                     cfg.comm.emulate.ranks_per_node > 0 ? "emulated: comm.emulate.ranks_per_node"
                                                         : "nodes as MPI finds them");
    }
  // train.pin_threads, when the job's compute threads fill the node's cores, one each (a job that leaves cores
  // free may share the node with another, which would pin to the same first cores): the communication threads below
  // inherit this rank's cores (they then delay only this rank's compute), the compute threads get one each.
  const std::vector<int> cores = cfg.train.pin_threads && on_node * threads == omp_get_num_procs()
                                     ? rank_cores(node.local_rank * threads, threads)
                                     : std::vector<int>();
  bind_calling_thread(cores);
  // The world communicator carries host values (metrics, the loss): a host transport whatever the backend.
  // The flight recorder wraps every communicator the mesh makes (docs/flight_recorder.md).
  if (cfg.run.flight_recorder)
    FlightRecorder::get().configure(cfg.run.flight_recorder_ops, cfg.run.dir + "/flight", rank, world);
  MeshComms comms = make_mesh_comms(mesh, MPI_COMM_WORLD, [&](MPI_Comm c, const std::string& name) {
    if (name == "dp" && cfg.comm.hierarchical)
      return with_flight_recorder(make_hierarchical_communicator(c, name, copts), c);
    if (nccl && name != "world") return with_flight_recorder(make_device_communicator(c, name, copts), c);
    return with_flight_recorder(make_communicator(c, name, copts), c);
  });
  // The compressors work on host copies of the gradients (GradReducer); an NCCL dp group takes device tensors only.
  if (nccl && compress_with_feedback(cfg.comm.compress) && comms.dp_mpi != MPI_COMM_NULL)
    comms.dp_host = with_flight_recorder(make_communicator(comms.dp_mpi, "dp.host", copts), comms.dp_mpi);
  // Its listener answers other ranks' dump requests and SIGUSR2 (unless run.stop_signals claims it); stopped before
  // the communicators go.
  struct FlightListener {
    FlightListener(const Config& cfg) {
      std::vector<int> stops;
      std::string bad;
      parse_stop_signals(cfg.run.stop_signals, stops, bad);
      const bool usr2_free = std::find(stops.begin(), stops.end(), SIGUSR2) == stops.end();
      FlightRecorder::get().start_listener(MPI_COMM_WORLD, usr2_free ? SIGUSR2 : 0);
    }
    ~FlightListener() { FlightRecorder::get().stop_listener(); }
  } flight_listener(cfg);
  // The communication threads, created above, have the rank's cores; now the compute threads get one each.
  if (!cores.empty()) {
    pin_compute_threads(cores);
    if (mesh.rank() == 0)
      spdlog::info("train.pin_threads: each rank's threads on cores of its own, one per compute thread (rank 0: "
                   "cpu {}{})", cores.front(), cores.size() > 1 ? fmt::format("-{}", cores.back()) : "");
  }
  for (Communicator* c : comms.all())
    c->set_event_sink([&](const CommEvent& e) {
      timeline.record(e);
      prof.comm(e);
    });
  // run.dir is this run's alone (rank 0 holds its lock until the end); status.json says how the run ended.
  std::string lock_error, holder, write_error;
  int lock_fd = -1;
  if (rank == 0) try {
      lock_fd = lock_run_dir(cfg.run.dir, holder);
      if (lock_fd < 0)
        lock_error = fmt::format("run.dir {} is in use by another run ({}, holding {}/.lock): give this run another "
                                 "run.dir, or wait for that one to end", cfg.run.dir, holder, cfg.run.dir);
      else
        try {
          write_run_status(cfg.run.dir, {"\"state\": \"running\"", fmt::format("\"pid\": {}", ::getpid())});
        } catch (const std::exception& e) {
          write_error = e.what();
        }
    } catch (const std::exception& e) {
      lock_error = e.what();
    }
  struct Unlock {
    int fd;
    ~Unlock() { unlock_run_dir(fd); }
  } unlock{lock_fd};
  agree_on_setup(lock_error, MPI_COMM_WORLD);
  // A run.dir that cannot be written (a full disk) is no bad input: every rank stops together with exit status 1.
  const int io_failed = write_error.empty() ? 0 : 1;
  const int any_io_failed = allreduce_int_yielding(io_failed, MPI_MAX, MPI_COMM_WORLD);
  if (any_io_failed) throw StoppedTogether(io_failed ? write_error : "rank 0 could not write run.dir/status.json");
  auto failed = [&](int code, const std::string& why) {
    if (lock_fd < 0) return;
    try {
      write_run_status(cfg.run.dir, {"\"state\": \"failed\"", fmt::format("\"exit_code\": {}", code),
                                     fmt::format("\"error\": {}", json_quote(why))});
    } catch (const std::exception& e) {
      spdlog::error("could not write {}/status.json: {}", cfg.run.dir, e.what());
    }
  };
  try {
    const RunEnd end = train_on_mesh(cfg, mesh, comms, nccl, timeline, prof, copts, threads, node.local_rank == 0);
    if (lock_fd >= 0) write_run_status(cfg.run.dir, end.fields);
  } catch (const SetupError& e) {
    failed(2, e.what());
    throw;  // every rank is here together: communicators shut down cleanly, main exits with status 2
  } catch (const StoppedTogether& e) {
    failed(1, e.what());
    throw;  // likewise, exit status 1
  } catch (const std::exception& e) {
    const bool input = dynamic_cast<const InputError*>(&e) != nullptr;
    failed(input ? 2 : 1, e.what());
    if (!input) {  // every rank's last operations, as on a watchdog timeout
      const std::string flight = FlightRecorder::get().dump_all(fmt::format("fatal error: {}", e.what()), 1.0);
      if (!flight.empty()) spdlog::error("[rank {}] {}", rank, flight);
    }
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
