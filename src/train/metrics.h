// metrics.jsonl: one JSON object per optimizer step (global rank 0 writes it), with the keys the README lists
// ("A run writes"). Flushed every row so a crashed run keeps what it measured.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

namespace mt {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  int64_t tokens = 0;  // cumulative
  double step_ms = 0, tokens_per_s = 0;
  // Wall-clock time from the start of the run's first step to the end of this one on the rank that got there last
  // (evaluations and checkpoints included): the time to reach this step's loss. With optim.staleness ranks are at
  // different steps, and this, not the sum of step_ms, is the run's time.
  double elapsed_ms = 0;
  double compute_ms = 0, comm_ms = 0, exposed_comm_ms = 0, bubble_ms = 0;
  // CPU time the communication threads of the rank used this step (their thread CPU clocks, all of the rank's
  // communicators), maximum over ranks: near 0 when they only slept while operations were in flight.
  double comm_cpu_ms = 0;
  // The rank that worked longest this step (its step time minus its waits for collectives and, in a pipeline,
  // for its neighbours) and the mean over the other ranks of how much less they worked: the time they spent
  // waiting for it. Both 0 on one rank.
  int slowest_rank = 0;
  double straggler_wait_ms = 0;
  // The slowest rank's own exposed communication: what the step could not hide even where nobody was waited for
  // (exposed_comm_ms, the maximum over ranks, also counts the other ranks' wait for the slowest).
  double slowest_exposed_comm_ms = 0;
  // optim.staleness > 0 (written when >= 0): how many steps old the gradient averages applied this step were,
  // the maximum and the mean over ranks of each rank's mean (0 = applied in the step that computed them).
  double staleness_max = -1, staleness_mean = -1;
  // comm.adapt (written when bucket_mb > 0): the bucket size and compression this step used, and on the step that
  // decided a change, what it decided and why.
  double bucket_mb = -1;
  int sync_every = -1;  // comm.adapt under local SGD (written when > 0): the period this step ran in
  std::string compress, adapt;
  double val_loss = -1;  // written only when >= 0 (evaluation rows)
  // Joules the CPU packages of every node drew this step (RAPL, core/energy.h), written only where every node
  // has readable counters: nothing is estimated.
  double energy_j = -1;
  // Joules every node's GPUs drew this step (NVML, core/gpu_energy.h; device: cuda), likewise only where every node
  // has the counters.
  double gpu_energy_j = -1;
  int64_t comm_bytes = 0;  // payload bytes sent by the busiest rank this step (all its communicators)
  double loss_scale = -1;  // fp16 only (written when > 0): the scale this step's backward pass used
  // fp16 or train.skip_nonfinite (written when >= 0): steps skipped so far, this one included (local SGD: by the
  // replica that skipped the most)
  int64_t skipped_steps = -1;
};

std::string to_json(const StepMetrics& m);

class MetricsWriter {
 public:
  // Truncates the file; or, with keep_through_step >= 0 (a resumed run), keeps its rows of steps up to that one
  // and appends after them, so the file holds each step once.
  explicit MetricsWriter(const std::string& path, int64_t keep_through_step = -1);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const StepMetrics& m);

 private:
  std::FILE* f_ = nullptr;
};

}  // namespace mt
