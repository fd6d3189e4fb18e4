// Hierarchical all-reduce (comm.hierarchical): a Communicator over a group whose all_reduce runs in three phases,
// reduce-scatter inside each node, all-reduce of this rank's shard across nodes, all-gather inside the node, so
// only 1/k of the buffer crosses the slow links between nodes (k = the group's ranks per node). The phases run on
// two ordinary communicators ("<name>.intra", "<name>.inter", from make_communicator, each emulating its own
// link); every other operation goes to a flat communicator over the whole group ("<name>"). Everything passes
// through one worker queue, so operations run in issue order as the Communicator contract requires. See
// docs/hierarchical.md.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace mt {

// How one rank of a group sits in the two-level hierarchy (pure arithmetic, no MPI).
struct HierarchicalLayout {
  int ranks_per_node = 1;  // k: the group's ranks on every node
  int nodes = 1;           // m: nodes the group spans
  int node = 0;            // this rank's node id (as given in node_of; the colour of the intra-node split)
  int local_rank = 0;      // this rank's position among the group's ranks on its node (group-rank order)
  std::string error;       // non-empty when the nodes hold different numbers of the group's ranks
};

// node_of[i]: the node id (any integer) of group rank i. Fills the layout of group rank `rank`; when the nodes
// hold different numbers of the group's ranks, `error` says which (and the other fields are meaningless).
HierarchicalLayout hierarchical_layout(const std::vector<int>& node_of, int rank);

// To validate a mesh before any communicator exists:
// hierarchical_layout(emulated_nodes(mesh.group_members(MeshAxis::DP, r), k), 0).error (emulated_nodes: comm_options.h).

// Alpha-beta time (us) of the three-phase all-reduce of `bytes` with k ranks per node and m nodes:
//   2(k-1)(a_i + bytes/k b_i) + 2(m-1)(a_e + bytes/(k m) b_e)
// (intra-node link a_i, b_i for the reduce-scatter and all-gather, inter-node link a_e, b_e for the middle phase).
double predict_hierarchical_us(int64_t bytes, int k, int m, const CommOptions& opts);

// Collective over `group` (it duplicates and splits it; the caller keeps its handle). Nodes: world rank /
// opts.ranks_per_node when ranks_per_node > 0 (the emulation's nodes), otherwise the real nodes
// (MPI_Comm_split_type SHARED). Throws InputError, on every rank of the group alike and before building any
// communicator, when the nodes hold different numbers of the group's ranks. The result's event sink receives
// the events of the sub-communicators ("<name>.intra" reduce_scatter / all_gather, "<name>.inter" all_reduce,
// and "<name>" for the operations that run flat); total_wait_us() counts callers blocked on its handles.
std::unique_ptr<Communicator> make_hierarchical_communicator(MPI_Comm group, const std::string& name,
                                                             const CommOptions& opts);

}  // namespace mt
