// MPI start-up for every meshtrain program (the trainer, the tests, the benchmarks). Each communicator runs its
// operations on its own thread, and several communicators (dp, tp, pp) call MPI at the same time, so MPI must be
// initialised with MPI_THREAD_MULTIPLE.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

namespace mt {

// MPI_Init_thread(MPI_THREAD_MULTIPLE); CHECK-fails when the library provides less. Returns the provided level.
int init_mpi(int* argc, char*** argv);

// The job's nodes as MPI finds them (MPI_COMM_TYPE_SHARED: the ranks that share memory, one host each), and this
// rank's place among them: the GPU a rank uses is its local rank modulo the node's GPUs. Nodes are numbered in
// order of their lowest world rank. Collective over MPI_COMM_WORLD.
struct NodeRanks {
  int local_rank = 0, local_size = 1;
  int node = 0, nodes = 1;
  std::vector<int> node_of;        // node of every world rank
  std::vector<std::string> hosts;  // host name of every node (MPI_Get_processor_name of its lowest rank)
  // "2 nodes: mt-h1 (ranks 0-1), mt-h2 (ranks 2-3)"; ranks listed as ranges where consecutive.
  std::string describe() const;
};
NodeRanks node_ranks();

// The node of every world rank as the last node_ranks() found it, or nullptr before the first call. Lets
// shares_memory() and finalize_mpi() answer without a collective: each MPI_Comm_split_type costs a whole round of
// messages, which with more ranks than cores (ranks spinning in MPI, waiting for peers the scheduler has not run)
// took about 170 ms at 8 ranks on 2 cores.
const std::vector<int>* world_node_map();

// Set-up collectives that yield the core while they wait: MPI's blocking calls spin, and with more ranks than
// cores a spinning rank keeps off the core the peer it waits for, so each round of messages waits for a scheduler
// time slice (25 MPI_Barriers of 8 ranks on 2 cores took 870 ms; as MPI_Ibarrier tested between sched_yield()s,
// 11 ms). For start-up and shutdown only: the steps' collectives run on the communication threads.
void wait_yielding(MPI_Request& request);
void comm_dup_yielding(MPI_Comm comm, MPI_Comm* out);  // MPI_Comm_dup
void barrier_yielding(MPI_Comm comm);
int allreduce_int_yielding(int value, MPI_Op op, MPI_Comm comm);  // returns op over every rank's value

// MPI_Finalize, guarded where the job spans nodes: MPICH 4.0's UCX transport over TCP can hang in MPI_Finalize
// (one rank waits for a peer that has already left UCX's progress loop to acknowledge closing their connection). All
// ranks pass a barrier first, so every output is written; if MPI_Finalize has not returned 10 s later, the
// process says so and exits with `status` itself. Returns `status`.
int finalize_mpi(int status);

}  // namespace mt
