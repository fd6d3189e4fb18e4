// The per-rank memory report of a run: what each rank held (parameters, gradients, optimizer state, activation
// records, pipeline receive buffers) and the measured peaks, logged per pipeline stage and written by rank 0 to
// run.dir/memory.json (the planner's memory model is validated against it).
#pragma once
#include <string>

#include "comm/communicator.h"
#include "parallel/mesh.h"

namespace mt {

struct RankMemory {
  double params = 0, grads = 0, optimizer = 0;  // bytes
  double activations = 0;   // the records of the most micro-batches the schedule had in flight (all chunks)
  double records = 0;       // how many records that was
  double buffers = 0;       // pipeline receive buffers
  double peak_tensors = 0;  // high-water mark of host tensor memory during training (peak_host_tensor_bytes)
  double peak_rss = 0;      // the process's peak resident set (bytes), including code, MPI and the data
};

// Collective over `world`: gathers every rank's figures; rank 0 logs each pipeline stage's activations and
// writes `path` (JSON: {"ranks": [{rank, dp_rank, tp_rank, pp_rank, params_bytes, ...}, ...]}).
void report_memory(const RankMemory& mine, const DeviceMesh& mesh, Communicator& world, const std::string& path);

// This process's peak resident set size in bytes.
double peak_rss_bytes();

}  // namespace mt
