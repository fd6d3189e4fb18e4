// Options of a communicator (comm.timeout_s and comm.emulate.* of CONTRACT.md) and the alpha-beta model that the
// network emulation uses. Bandwidths are in GB/s (1e9 bytes per second), latencies in microseconds; every
// emulation field 0 means "no emulation" for that term (0 latency, unlimited bandwidth). See docs/comm.md.
#pragma once
#include <cstdint>

namespace mt {

struct CommOptions {
  double latency_us = 0;            // per-message latency (alpha) of links within an emulated node
  double bandwidth_gbps = 0;        // bandwidth of links within a node, GB/s (0 = unlimited)
  int ranks_per_node = 0;           // consecutive MPI_COMM_WORLD ranks per emulated node (0 = one node)
  double inter_latency_us = 0;      // alpha of links between nodes
  double inter_bandwidth_gbps = 0;  // bandwidth between nodes, GB/s (0 = unlimited)
  double timeout_s = 300;           // watchdog: a wait() longer than this aborts the job (0 = wait forever)
  // true: collectives are blocking MPI calls, which spin while a peer is late (fastest when every thread has a
  // core); false: nonblocking calls polled with back-off, which leave the cores to compute (for nodes with more
  // threads than cores). MESHTRAIN_COMM_WAIT=poll|block overrides it.
  bool blocking_waits = false;

  bool emulating() const {
    return latency_us > 0 || bandwidth_gbps > 0 || inter_latency_us > 0 || inter_bandwidth_gbps > 0;
  }
};

// One emulated link: time(n bytes) = alpha_us + n * beta_us_per_byte.
struct LinkModel {
  double alpha_us = 0;
  double beta_us_per_byte = 0;
};
// The intra- or inter-node link of `opts`.
LinkModel link_model(const CommOptions& opts, bool inter_node);

enum class CommKind { AllReduce, ReduceScatter, AllGather, Broadcast, Send, Recv, Barrier };
const char* comm_kind_name(CommKind k);

// Predicted time (us) of an operation over p ranks on `link`. `bytes` is the whole buffer: all_reduce's tensor,
// reduce_scatter's input, all_gather's output, broadcast's tensor, the message of send/recv.
//   all_reduce (ring)           2(p-1) (alpha + bytes/p * beta)
//   reduce_scatter, all_gather  (p-1) (alpha + bytes/p * beta)
//   broadcast (binomial tree)   ceil(log2 p) (alpha + bytes * beta)
//   send, recv                  alpha + bytes * beta
//   barrier                     2 ceil(log2 p) alpha
double predict_us(CommKind kind, int64_t bytes, int p, const LinkModel& link);

}  // namespace mt
