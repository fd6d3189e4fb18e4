// MPI start-up (MPI_THREAD_MULTIPLE) and this rank's place on its node.
#include "comm/mpi_init.h"

#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "core/check.h"

namespace mt {
namespace {
std::vector<int> g_node_of;  // node_ranks()'s node_of, once it ran
}  // namespace

const std::vector<int>* world_node_map() { return g_node_of.empty() ? nullptr : &g_node_of; }

void wait_yielding(MPI_Request& request) {
  for (int done = 0;;) {
    MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    sched_yield();
  }
}

void comm_dup_yielding(MPI_Comm comm, MPI_Comm* out) {
  MPI_Request r;
  MPI_CHECK(MPI_Comm_idup(comm, out, &r));
  wait_yielding(r);
}

void barrier_yielding(MPI_Comm comm) {
  MPI_Request r;
  MPI_CHECK(MPI_Ibarrier(comm, &r));
  wait_yielding(r);
}

int allreduce_int_yielding(int value, MPI_Op op, MPI_Comm comm) {
  int out = value;
  MPI_Request r;
  MPI_CHECK(MPI_Iallreduce(&value, &out, 1, MPI_INT, op, comm, &r));
  wait_yielding(r);
  return out;
}

int init_mpi(int* argc, char*** argv) {
  int provided = 0;
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  CHECK(provided >= MPI_THREAD_MULTIPLE,
        "MPI provides thread level {}, meshtrain needs MPI_THREAD_MULTIPLE ({}): one communication thread per "
        "communicator calls MPI concurrently",
        provided, MPI_THREAD_MULTIPLE);
  return provided;
}

NodeRanks node_ranks() {
  int world = 1, rank = 0;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  NodeRanks r;
  MPI_CHECK(MPI_Comm_rank(node, &r.local_rank));
  MPI_CHECK(MPI_Comm_size(node, &r.local_size));
  const int leader = allreduce_int_yielding(rank, MPI_MIN, node);  // the node's lowest world rank names it
  MPI_CHECK(MPI_Comm_free(&node));
  std::vector<int> leaders(static_cast<size_t>(world));
  MPI_CHECK(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD));
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_CHECK(MPI_Get_processor_name(name, &len));
  std::vector<char> names(static_cast<size_t>(world) * MPI_MAX_PROCESSOR_NAME);
  MPI_CHECK(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                          MPI_COMM_WORLD));
  r.node_of.resize(static_cast<size_t>(world));
  std::vector<int> index_of_leader(static_cast<size_t>(world), -1);
  for (int w = 0; w < world; ++w) {  // leaders appear in increasing order of their own rank
    int& index = index_of_leader[static_cast<size_t>(leaders[w])];
    if (index < 0) {
      index = static_cast<int>(r.hosts.size());
      r.hosts.emplace_back(&names[static_cast<size_t>(leaders[w]) * MPI_MAX_PROCESSOR_NAME]);
    }
    r.node_of[static_cast<size_t>(w)] = index;
  }
  r.nodes = static_cast<int>(r.hosts.size());
  r.node = r.node_of[static_cast<size_t>(rank)];
  g_node_of = r.node_of;
  return r;
}

int finalize_mpi(int status) {
  bool one_node = true;
  if (const std::vector<int>* node_of = world_node_map()) {
    for (int n : *node_of) one_node = one_node && n == node_of->front();
  } else {
    int world = 1, local = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    one_node = local == world;
  }
  if (!one_node) {
    barrier_yielding(MPI_COMM_WORLD);
    std::thread([status] {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      std::fprintf(stderr, "MPI_Finalize has not returned after 10 s (a known hang of MPICH's UCX transport over "
                           "TCP); everything is written, so this rank exits now with status %d\n", status);
      std::fflush(nullptr);
      ::_exit(status);
    }).detach();
  }
  MPI_Finalize();
  return status;
}

std::string NodeRanks::describe() const {
  std::string out = std::to_string(nodes) + (nodes == 1 ? " node: " : " nodes: ");
  for (int n = 0; n < nodes; ++n) {
    std::string ranks;
    for (int w = 0; w < static_cast<int>(node_of.size()); ++w) {
      if (node_of[static_cast<size_t>(w)] != n) continue;
      int last = w;
      while (last + 1 < static_cast<int>(node_of.size()) && node_of[static_cast<size_t>(last + 1)] == n) ++last;
      ranks += (ranks.empty() ? "" : ",") + std::to_string(w) + (last > w ? "-" + std::to_string(last) : "");
      w = last;
    }
    out += (n ? ", " : "") + hosts[static_cast<size_t>(n)] + " (rank" + (ranks.find_first_of(",-") != std::string::npos ? "s " : " ") + ranks + ")";
  }
  return out;
}

}  // namespace mt
