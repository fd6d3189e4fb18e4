// MPI start-up for every meshtrain program (the trainer, the tests, the benchmarks). Each communicator runs its
// operations on its own thread, and several communicators (dp, tp, pp) call MPI at the same time, so MPI must be
// initialised with MPI_THREAD_MULTIPLE.
#pragma once

namespace mt {

// MPI_Init_thread(MPI_THREAD_MULTIPLE); CHECK-fails when the library provides less. Returns the provided level.
int init_mpi(int* argc, char*** argv);

// This rank's position among the ranks on its node (MPI_COMM_TYPE_SHARED), and how many there are: the GPU a
// rank uses is its local rank modulo the node's GPUs. Collective over MPI_COMM_WORLD.
struct NodeRanks {
  int local_rank = 0, local_size = 1;
};
NodeRanks node_ranks();

}  // namespace mt
