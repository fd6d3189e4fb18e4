// Helpers shared by every Communicator backend: shards, the trace clock and the alpha-beta model.
#include "comm/communicator.h"

#include <algorithm>
#include <chrono>

namespace mt {

ShardRange shard_range(int64_t n, int size, int rank) {
  CHECK(size > 0 && rank >= 0 && rank < size && n >= 0, "shard_range(n={}, size={}, rank={})", n, size, rank);
  const int64_t c = (n + size - 1) / size;
  ShardRange r;
  r.begin = std::min(n, static_cast<int64_t>(rank) * c);
  r.end = std::min(n, static_cast<int64_t>(rank + 1) * c);
  return r;
}

double trace_clock_us() {
  // CLOCK_MONOTONIC is machine-wide, so the ranks of one machine share the time base (their traces line up).
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

LinkModel link_model(const CommOptions& o, bool inter_node) {
  const double lat = inter_node ? o.inter_latency_us : o.latency_us;
  const double bw = inter_node ? o.inter_bandwidth_gbps : o.bandwidth_gbps;
  LinkModel m;
  m.alpha_us = lat;
  m.beta_us_per_byte = bw > 0 ? 1e6 / (bw * 1e9) : 0.0;  // us per byte at bw GB/s
  return m;
}

int node_link_sharers(int ranks_per_node, int on_node) {
  return ranks_per_node > 0 && on_node > 0 ? std::max(1, ranks_per_node / on_node) : 1;
}

LinkModel shared_link(LinkModel link, int sharers) {
  link.beta_us_per_byte *= std::max(1, sharers);
  return link;
}

const char* comm_kind_name(CommKind k) {
  switch (k) {
    case CommKind::AllReduce: return "all_reduce";
    case CommKind::ReduceScatter: return "reduce_scatter";
    case CommKind::AllGather: return "all_gather";
    case CommKind::Broadcast: return "broadcast";
    case CommKind::Send: return "send";
    case CommKind::Recv: return "recv";
    case CommKind::Barrier: return "barrier";
  }
  return "?";
}

std::vector<int> emulated_nodes(const std::vector<int>& world_ranks, int ranks_per_node) {
  std::vector<int> nodes(world_ranks.size(), 0);
  if (ranks_per_node > 0)
    for (size_t i = 0; i < world_ranks.size(); ++i) nodes[i] = world_ranks[i] / ranks_per_node;
  return nodes;
}

static int ceil_log2(int p) {
  int k = 0;
  while ((1 << k) < p) ++k;
  return k;
}

double predict_us(CommKind kind, int64_t bytes, int p, const LinkModel& l) {
  const double n = static_cast<double>(bytes);
  switch (kind) {
    case CommKind::AllReduce: return 2.0 * (p - 1) * (l.alpha_us + n / p * l.beta_us_per_byte);
    case CommKind::ReduceScatter:
    case CommKind::AllGather: return (p - 1) * (l.alpha_us + n / p * l.beta_us_per_byte);
    case CommKind::Broadcast: return ceil_log2(p) * (l.alpha_us + n * l.beta_us_per_byte);
    case CommKind::Send:
    case CommKind::Recv: return l.alpha_us + n * l.beta_us_per_byte;
    case CommKind::Barrier: return 2.0 * ceil_log2(p) * l.alpha_us;
  }
  return 0;
}

}  // namespace mt
