// MPI start-up (MPI_THREAD_MULTIPLE) and this rank's place on its node.
#include "comm/mpi_init.h"

#include <mpi.h>

#include "core/check.h"

namespace mt {

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
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  NodeRanks r;
  MPI_CHECK(MPI_Comm_rank(node, &r.local_rank));
  MPI_CHECK(MPI_Comm_size(node, &r.local_size));
  MPI_CHECK(MPI_Comm_free(&node));
  return r;
}

}  // namespace mt
