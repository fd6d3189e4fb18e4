#include "train/step_report.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "comm/flight_recorder.h"

namespace mt {

namespace {

std::string format_duration(double seconds) {
  long s = std::lround(std::max(0.0, seconds));
  return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
}

// One rank's figures of a step. Every rank writes its own in its row of a world x kFigures table, zeros elsewhere,
// and one Sum all-reduce gives every rank all of them exactly (a sum with zeros), whatever their signs.
struct RankFigures {
  float step_ms, comm_ms, exposed_ms;
  float span_ms, busy_ms;  // the pipeline phase
  float mib_sent;          // MiB: fp32 holds any step's traffic exactly enough
  float comm_cpu_ms;
  float own_ms;            // the step less its waits for other ranks
  float staleness_max, staleness_mean;  // of the averages this rank applied (optim.staleness)
  float loss_sum;          // this rank's summed token losses (replicas not in lockstep: the loss travels here)
  float elapsed_ms;        // since the first step began, at the end of this one
  float final_backward_ms;  // the last gradient pass (comm.adapt's overlap window)
  float link_ops, link_mib, link_us, link_mib2, link_mib_us;  // the gradient reductions (CommTimeline::LinkSums)
  float energy_j;          // a node's leading rank: its node's CPU energy this step (0 elsewhere)
  float node_leader, energy_read;  // 1 on a node's leading rank; 1 there when it has energy counters
  float gpu_energy_j, gpu_energy_read;  // the same for the node's GPUs (NVML; device: cuda only)
  float skipped;           // the steps this rank skipped so far (local SGD: each replica its own)
};
constexpr int kFigures = sizeof(RankFigures) / sizeof(float);
static_assert(sizeof(RankFigures) == kFigures * sizeof(float), "RankFigures is reduced as a float array");

}  // namespace

StepMeter::StepMeter(TrainingRun& run, CommTimeline& timeline, bool node_leader)
    : run_(run), timeline_(timeline), node_leader_(node_leader) {
  if (node_leader) energy_ = std::make_unique<EnergyMeter>();
  if (node_leader && run.dev == Device::CUDA) gpu_energy_ = std::make_unique<GpuEnergyMeter>();
  // The same ranks, the same emulated link: the world's small all-reduces tell comm.adapt the per-operation cost.
  timeline.set_world_is_dp(run.mesh.dp() == run.mesh.world_size());
  MeshComms& c = run.comms;
  // Exposed communication: compute blocked on collectives. Waits for pipeline neighbours are the bubble instead.
  for (Communicator* x : {c.world.get(), c.dp.get(), c.tp.get(), c.emb.get()})
    if (x) blocking_.push_back(x);
  // A hierarchical communicator's CPU count already includes its sub-communicators, and an emulated one its inner
  // transport's.
  threads_ = c.all();
}

double StepMeter::wait_us() const {
  double w = 0;
  for (Communicator* c : blocking_) w += c->total_wait_us();
  return w;
}

double StepMeter::comm_cpu_us() const {
  double us = 0;
  for (Communicator* c : threads_) us += c->thread_cpu_us();
  return us;
}

void StepMeter::begin() {
  t0_us_ = trace_clock_us();
  if (start_us_ < 0) start_us_ = t0_us_;
  wait0_ = wait_us();
  cpu0_ = comm_cpu_us();
  if (energy_) energy_->joules();  // from here: an evaluation's or a checkpoint's energy is not the step's
  timeline_.take_bytes();
}

std::vector<float>& StepMeter::measure(const StepResult& s) {
  const double now = trace_clock_us();
  RankFigures f;
  f.step_ms = float((now - t0_us_) / 1000.0);
  f.comm_ms = float(timeline_.busy_ms(t0_us_, now));
  f.exposed_ms = float((wait_us() - wait0_) / 1000.0);
  f.span_ms = float(s.pipeline.span_ms);
  f.busy_ms = float(s.pipeline.busy_ms);
  f.mib_sent = float(timeline_.take_bytes() / 1048576.0);
  f.comm_cpu_ms = float(std::max(0.0, (comm_cpu_us() - cpu0_) / 1000.0));  // at most threads x step_ms
  // Waits for others: collectives, and in a pipeline its neighbours (the bubble).
  const double bubble = run_.mesh.pp() > 1 ? s.pipeline.span_ms - s.pipeline.busy_ms : 0.0;
  f.own_ms = float(std::max(0.0, double(f.step_ms) - f.exposed_ms - bubble));
  f.staleness_max = float(s.staleness_max);
  f.staleness_mean = float(s.staleness_mean);
  f.loss_sum = float(s.local_loss_sum);
  f.elapsed_ms = float((now - start_us_) / 1000.0);
  f.final_backward_ms = float(s.pipeline.final_backward_ms);
  const CommTimeline::LinkSums link = timeline_.take_link_sums();
  f.link_ops = float(link.ops);
  f.link_mib = float(link.mib);
  f.link_us = float(link.us);
  f.link_mib2 = float(link.mib2);
  f.link_mib_us = float(link.mib_us);
  f.node_leader = node_leader_ ? 1.0f : 0.0f;
  f.energy_read = energy_ && energy_->available() ? 1.0f : 0.0f;
  f.energy_j = f.energy_read > 0 ? float(energy_->joules()) : 0.0f;
  f.gpu_energy_read = gpu_energy_ && gpu_energy_->available() ? 1.0f : 0.0f;
  f.gpu_energy_j = f.gpu_energy_read > 0 ? float(gpu_energy_->joules()) : 0.0f;
  f.skipped = float(run_.scaler.skipped_steps() + run_.nonfinite_skipped);
  const size_t world = size_t(run_.mesh.world_size()), rank = size_t(run_.mesh.rank());
  const std::vector<Communicator*> groups = digest_groups();
  const size_t digests = groups.size() * kDigestFloats;
  table_.assign((kFigures + digests) * world, 0.0f);
  std::memcpy(table_.data() + kFigures * rank, &f, sizeof f);
  write_digests(groups, table_.data() + kFigures * world + digests * rank);
  return table_;
}

std::vector<Communicator*> StepMeter::digest_groups() const {
  const MeshComms& c = run_.comms;
  return {c.world.get(), c.dp.get(), c.tp.get(), c.pp.get(), c.cp.get(), c.emb.get()};
}

void StepMeter::fill_row(const std::vector<float>& table, StepMetrics& row, AdaptSample* adapt) const {
  const int world = run_.mesh.world_size();
  if (world > 1) check_digests(digest_groups(), table.data() + size_t(kFigures) * world, run_.mesh.rank(), row.step);
  std::vector<RankFigures> all(world);
  std::memcpy(all.data(), table.data(), sizeof(RankFigures) * world);
  RankFigures m = all[0];  // the maximum over ranks of each figure
  for (const RankFigures& f : all) {
    m.step_ms = std::max(m.step_ms, f.step_ms);
    m.comm_ms = std::max(m.comm_ms, f.comm_ms);
    m.exposed_ms = std::max(m.exposed_ms, f.exposed_ms);
    m.span_ms = std::max(m.span_ms, f.span_ms);
    m.busy_ms = std::min(m.busy_ms, f.busy_ms);  // the least busy stage
    m.mib_sent = std::max(m.mib_sent, f.mib_sent);
    m.comm_cpu_ms = std::max(m.comm_cpu_ms, f.comm_cpu_ms);
    m.staleness_max = std::max(m.staleness_max, f.staleness_max);
    m.elapsed_ms = std::max(m.elapsed_ms, f.elapsed_ms);
    m.final_backward_ms = std::max(m.final_backward_ms, f.final_backward_ms);
    m.skipped = std::max(m.skipped, f.skipped);
  }
  row.elapsed_ms = m.elapsed_ms;
  row.step_ms = m.step_ms;
  row.comm_ms = m.comm_ms;
  row.comm_cpu_ms = m.comm_cpu_ms;
  row.exposed_comm_ms = m.exposed_ms;
  // The bubble of a stage is the pipeline phase's length (its slowest stage) minus the stage's own compute in it.
  row.bubble_ms = run_.mesh.pp() > 1 ? std::max(0.0f, m.span_ms - m.busy_ms) : 0.0;
  row.compute_ms = std::max(0.0, row.step_ms - row.exposed_comm_ms - row.bubble_ms);
  row.tokens_per_s = run_.tokens_per_step / (row.step_ms / 1000.0);
  row.comm_bytes = std::llround(double(m.mib_sent) * 1048576.0);
  // Where written (the caller sets it to 0 then): the most any rank skipped (every rank alike, except local SGD's
  // replicas, which skip alone).
  if (row.skipped_steps >= 0) row.skipped_steps = std::llround(m.skipped);
  int slowest = 0;
  double waited = 0, stale_sum = 0, loss_sum = 0, energy = 0, leaders = 0, read = 0, gpu_energy = 0, gpu_read = 0;
  for (const RankFigures& f : all) {
    energy += f.energy_j, leaders += f.node_leader, read += f.energy_read;
    gpu_energy += f.gpu_energy_j, gpu_read += f.gpu_energy_read;
  }
  if (leaders > 0 && read == leaders) row.energy_j = energy;
  if (leaders > 0 && gpu_read == leaders) row.gpu_energy_j = gpu_energy;
  for (int r = 0; r < world; ++r)
    if (all[r].own_ms > all[slowest].own_ms) slowest = r;
  for (int r = 0; r < world; ++r) {
    waited += all[slowest].own_ms - all[r].own_ms;
    stale_sum += all[r].staleness_mean;
    loss_sum += all[r].loss_sum;
  }
  row.slowest_rank = slowest;
  row.slowest_exposed_comm_ms = all[slowest].exposed_ms;
  row.straggler_wait_ms = world > 1 ? waited / (world - 1) : 0.0;
  if (adapt) {
    // The same figures on every rank, so that every rank's controller decides alike: the step's maxima, and rank
    // 0's gradient reductions (every rank takes part in each, so their times agree up to when each saw it end).
    constexpr double kMiB = 1048576.0;
    const RankFigures& r0 = all[0];
    adapt->step_ms = m.step_ms;
    // The slowest rank's: the others' exposed time also holds their wait for it, which no setting changes.
    adapt->exposed_ms = row.slowest_exposed_comm_ms;
    adapt->backward_ms = m.final_backward_ms;
    adapt->ops = r0.link_ops;
    adapt->sum_b = double(r0.link_mib) * kMiB;
    adapt->sum_t = r0.link_us;
    adapt->sum_bb = double(r0.link_mib2) * kMiB * kMiB;
    adapt->sum_bt = double(r0.link_mib_us) * kMiB;
  }
  if (!run_.dp->lockstep()) row.loss = loss_sum / double(run_.tokens_per_step);
  if (run_.cfg.optim.staleness > 0) {
    row.staleness_max = m.staleness_max;
    row.staleness_mean = stale_sum / world;
  }
}

void StepMeter::end(const StepResult& s, StepMetrics& row, AdaptSample* adapt) {
  std::vector<float>& table = measure(s);
  if (run_.mesh.world_size() > 1) {
    Tensor view(table.data(), {int64_t(table.size())}, DType::F32);
    run_.comms.world->all_reduce(view, ReduceOp::Sum);
  }
  fill_row(table, row, adapt);
}

void PendingRows::add(const StepMetrics& row, const std::vector<float>& table, bool synced) {
  q_.push_back({row, table, synced, nullptr});
  Pending& p = q_.back();
  if (!world_) return;
  FlightSite site("step metrics");
  const Tensor table_view(p.table.data(), {int64_t(p.table.size())}, DType::F32);
  timeline_.leave_out_next_all_reduce(world_->name(), int64_t(table_view.nbytes()));
  p.work = world_->all_reduce_async(table_view, ReduceOp::Sum);
}

void PendingRows::flush(bool all, const Report& report) {
  while (!q_.empty() && (all || !q_.front().work || q_.front().work->done())) {
    Pending& p = q_.front();
    if (p.work) p.work->wait();
    AdaptSample sample;
    meter_.fill_row(p.table, p.row, &sample);
    report(p.row, sample, p.synced);
    q_.pop_front();
  }
}

void log_step(const StepMetrics& row, int steps, bool multi_rank, bool pipeline, double eta_s) {
  spdlog::info("step {:>5}/{} | loss {:.4f}{} | lr {:.3e} | grad norm {:.4f} | {:.0f} tok/s | {:.1f} ms/step{} | "
               "ETA {}",
               row.step, steps, row.loss, row.val_loss >= 0 ? fmt::format(" | val {:.4f}", row.val_loss) : "", row.lr,
               row.grad_norm, row.tokens_per_s, row.step_ms,
               multi_rank ? fmt::format(" (comm {:.1f}, comm cpu {:.1f}, exposed {:.1f}{}, slowest rank {}: others "
                                        "waited {:.1f})",
                                        row.comm_ms, row.comm_cpu_ms, row.exposed_comm_ms,
                                        pipeline ? fmt::format(", bubble {:.1f}", row.bubble_ms) : "",
                                        row.slowest_rank, row.straggler_wait_ms)
                          : "",
               format_duration(eta_s));
}

}  // namespace mt
