// Reporting a step: what one rank measured (wall time, communication in flight, compute blocked on collectives,
// the pipeline's span and busy time, bytes sent, communication-thread CPU), combined over the ranks into the row
// of metrics.jsonl, and the console line.
#pragma once
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "core/energy.h"
#include "core/gpu_energy.h"
#include "train/comm_adapt.h"
#include "train/comm_timeline.h"
#include "train/metrics.h"
#include "train/train_step.h"

namespace mt {

class StepMeter {
 public:
  // node_leader: this rank reads its node's energy counters for the row's energy_j (one rank per node).
  StepMeter(TrainingRun& run, CommTimeline& timeline, bool node_leader);
  // Whether every step's row can carry energy_j on this rank's node, and if not why (for the start-up log).
  const EnergyMeter* energy() const { return energy_.get(); }
  const GpuEnergyMeter* gpu_energy() const { return gpu_energy_.get(); }  // the same for gpu_energy_j (device: cuda)
  // At the start of a step (forgets traffic since the last step, e.g. an evaluation's).
  void begin();
  // At the end of the step's work: fills row's timings, each the maximum over ranks, comm_bytes and the slowest
  // rank (collective over the world). The same reduction carries the flight recorder's collective digests: a desync
  // that did not hang ends the job here (check_digests, comm/flight_recorder.h).
  // With `adapt`, also the figures comm.adapt's controller takes (the same on every rank).
  void end(const StepResult& s, StepMetrics& row, AdaptSample* adapt = nullptr);
  // end() in two halves, for a reduction that runs in the background (replicas not in lockstep): this rank's
  // figures in its row of a world-sized table (zeros elsewhere; valid until the next measure), and the row from
  // that table summed over the ranks (then also the loss, and with optim.staleness the staleness seen).
  std::vector<float>& measure(const StepResult& s);
  void fill_row(const std::vector<float>& table, StepMetrics& row, AdaptSample* adapt = nullptr) const;

 private:
  double wait_us() const;
  double comm_cpu_us() const;
  std::vector<Communicator*> digest_groups() const;  // every rank's groups in one order (null where it has none)

  TrainingRun& run_;
  CommTimeline& timeline_;
  std::vector<Communicator*> blocking_;  // whose waits are exposed communication (not the pipeline's)
  std::vector<Communicator*> threads_;   // each communicator object once, for their threads' CPU time
  double t0_us_ = 0, wait0_ = 0, cpu0_ = 0;
  double start_us_ = -1;  // when the first step began
  std::vector<float> table_;  // the step's figures of every rank, reduced as one
  bool node_leader_;
  std::unique_ptr<EnergyMeter> energy_;  // on a node's leading rank
  std::unique_ptr<GpuEnergyMeter> gpu_energy_;  // there too, with device: cuda
};

// Replicas not in lockstep (optim.staleness, local SGD): rows whose figures are still being summed over the ranks
// in the background, so that reporting a step never waits for the slowest rank.
class PendingRows {
 public:
  // A completed row, comm.adapt's figures of it, and whether its step ended with a parameter average.
  using Report = std::function<void(StepMetrics&, const AdaptSample&, bool synced)>;
  PendingRows(const StepMeter& meter, Communicator* world, CommTimeline& timeline)
      : meter_(meter), world_(world), timeline_(timeline) {}
  // row: what this rank knows of the step; table: its figures from StepMeter::measure.
  void add(const StepMetrics& row, const std::vector<float>& table, bool synced);
  // Completes the rows whose figures have arrived, in step order (with `all`, every row, waiting for them), and
  // passes each to report.
  void flush(bool all, const Report& report);

 private:
  struct Pending {
    StepMetrics row;
    std::vector<float> table;
    bool synced;
    WorkPtr work;
  };
  const StepMeter& meter_;
  Communicator* world_;    // null on one rank
  CommTimeline& timeline_;
  std::deque<Pending> q_;  // a deque: the tables in flight never move
};

// The console line of a step (every run.log_every steps, the first and the last).
void log_step(const StepMetrics& row, int steps, bool multi_rank, bool pipeline, double eta_s);

}  // namespace mt
