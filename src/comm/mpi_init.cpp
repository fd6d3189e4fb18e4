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

}  // namespace mt
