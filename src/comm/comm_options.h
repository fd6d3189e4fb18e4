// Options of a communicator (comm.timeout_s and comm.emulate.*) and the alpha-beta model that the
// network emulation uses. Bandwidths are in GB/s (1e9 bytes per second), latencies in microseconds; every
// emulation field 0 means "no emulation" for that term (0 latency, unlimited bandwidth). See docs/comm.md.
#pragma once
#include <cstdint>
#include <vector>

namespace mt {

struct CommOptions {
  double latency_us = 0;            // per-message latency (alpha) of links within an emulated node
  double bandwidth_gbps = 0;        // bandwidth of links within a node, GB/s (0 = unlimited)
  int ranks_per_node = 0;           // consecutive MPI_COMM_WORLD ranks per emulated node (0 = one node)
  double inter_latency_us = 0;      // alpha of links between nodes
  double inter_bandwidth_gbps = 0;  // bandwidth between nodes, GB/s (0 = unlimited)
  double timeout_s = 300;           // watchdog: a wait() longer than this aborts the job (0 = wait forever)
  // Which transport moves the data (comm.backend): Auto takes shared memory for a group whose ranks share one
  // machine's memory and MPI otherwise (make_communicator.h).
  enum class Transport { Auto, Shm, Mpi };
  Transport transport = Transport::Auto;
  // The MPI transport only (comm.wait): true: collectives are blocking MPI calls, which spin while a peer is late;
  // false: nonblocking calls polled with back-off, which leave the cores to compute.
  bool blocking_waits = false;
  // comm.thread_priority, as the trainer resolved it: the threads that never spin (shared-memory transport, network
  // emulation, hierarchical worker) run under SCHED_FIFO priority 1 (realtime_threads.h).
  bool realtime_threads = false;

  bool emulating() const {
    return latency_us > 0 || bandwidth_gbps > 0 || inter_latency_us > 0 || inter_bandwidth_gbps > 0;
  }
};

// The emulated node of each of `world_ranks` (world rank / ranks_per_node; every rank on node 0 when
// ranks_per_node <= 0), as comm.emulate.ranks_per_node defines nodes.
std::vector<int> emulated_nodes(const std::vector<int>& world_ranks, int ranks_per_node);

// One emulated link: time(n bytes) = alpha_us + n * beta_us_per_byte.
struct LinkModel {
  double alpha_us = 0;
  double beta_us_per_byte = 0;
};
// The intra- or inter-node link of `opts`.
LinkModel link_model(const CommOptions& opts, bool inter_node);
// A node's link is shared: when a group spanning nodes has `on_node` of a node's `ranks_per_node` ranks, the node's
// other ranks are in groups of the same shape (the mesh's other tp ranks, dp replicas or pipelines) that
// communicate at the same moments, so ranks_per_node / on_node groups cross the node's link at once (at least 1).
// Measured on real hosts: dp 2 across 2 hosts next to tp 2 inside each took twice the bandwidth term of one group
// (docs/multinode.md, "The network model against the network").
int node_link_sharers(int ranks_per_node, int on_node);
// `link` with its bandwidth divided among `sharers` groups.
LinkModel shared_link(LinkModel link, int sharers);

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
