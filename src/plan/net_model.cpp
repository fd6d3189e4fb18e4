// Network costs of a layout (see net_model.h).
#include "plan/net_model.h"

#include <algorithm>

#include "parallel/mesh.h"

namespace mt::plan {

NetModel::NetModel(const Config& cfg, const NetOptions& o) : net_(o) {
  const EmulateConfig& e = cfg.comm.emulate;
  opts_.latency_us = e.latency_us;
  opts_.bandwidth_gbps = e.bandwidth_gbps;
  opts_.ranks_per_node = e.ranks_per_node;
  opts_.inter_latency_us = e.inter_latency_us;
  opts_.inter_bandwidth_gbps = e.inter_bandwidth_gbps;
}

double NetModel::op_us(CommKind kind, int64_t bytes, int p, bool inter, int sharers) const {
  if (p <= 1 && kind != CommKind::Send && kind != CommKind::Recv) return net_.op_overhead_us;
  const LinkModel link = inter ? shared_link(link_model(opts_, true), sharers) : link_model(opts_, false);
  const double emulated = opts_.emulating() ? predict_us(kind, bytes, p, link) : 0.0;
  LinkModel shm;
  shm.alpha_us = net_.shm_latency_us;
  shm.beta_us_per_byte = 1e6 / (net_.shm_gbps * 1e9);
  const double real = predict_us(kind, bytes, std::max(p, 2), shm);
  return std::max(emulated, real) + net_.op_overhead_us;
}

double NetModel::cpu_us(CommKind kind, int64_t bytes, int p) const {
  if (p <= 1) return 0;
  LinkModel moved;
  moved.alpha_us = 0;
  moved.beta_us_per_byte = net_.comm_cpu_ns_per_byte / 1000;
  return net_.comm_cpu_op_us + predict_us(kind, bytes, p, moved);
}

MeshLinks mesh_links(const Config& cfg, int world) {
  const int k = cfg.comm.emulate.ranks_per_node;
  const int dp = resolved_dp(cfg, world), tp = cfg.parallel.tp, pp = cfg.parallel.pp, cp = cfg.parallel.cp;
  DeviceMesh mesh(dp, tp, pp, cfg.parallel.order, world, 0, cp);
  auto node = [&](int r) { return k > 0 ? r / k : 0; };
  auto spans = [&](const std::vector<int>& ranks) {
    return std::any_of(ranks.begin(), ranks.end(), [&](int r) { return node(r) != node(ranks[0]); });
  };
  // Groups crossing rank r's node link at once, for a group of r's that spans nodes (1 otherwise).
  auto sharers = [&](const std::vector<int>& ranks, int r) {
    if (!spans(ranks)) return 1;
    const int on_node = static_cast<int>(std::count_if(ranks.begin(), ranks.end(), [&](int q) { return node(q) == node(r); }));
    return node_link_sharers(k, on_node);
  };
  MeshLinks l;
  l.pp.assign(std::max(0, pp - 1), false);
  for (int r = 0; r < world; ++r) {
    l.tp = l.tp || spans(mesh.group_members(MeshAxis::TP, r));
    // The gradients' group: the dp x cp replicas (dp itself without context parallelism).
    l.dp = l.dp || spans(mesh.replica_members(r));
    l.cp = l.cp || spans(mesh.group_members(MeshAxis::CP, r));
    l.tp_sharers = std::max(l.tp_sharers, sharers(mesh.group_members(MeshAxis::TP, r), r));
    l.dp_sharers = std::max(l.dp_sharers, sharers(mesh.replica_members(r), r));
    l.cp_sharers = std::max(l.cp_sharers, sharers(mesh.group_members(MeshAxis::CP, r), r));
    l.pp_sharers = std::max(l.pp_sharers, sharers(mesh.group_members(MeshAxis::PP, r), r));
    const std::vector<int> stages = mesh.group_members(MeshAxis::PP, r);
    for (int s = 0; s + 1 < pp; ++s) l.pp[s] = l.pp[s] || node(stages[s]) != node(stages[s + 1]);
    if (pp > 1) l.emb = l.emb || node(stages.front()) != node(stages.back());
  }
  std::vector<int> all(world);
  for (int r = 0; r < world; ++r) all[r] = r;
  l.world = spans(all);
  return l;
}

}  // namespace mt::plan
