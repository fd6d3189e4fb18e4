// Catch2 entry point for the unit tests: MPI is initialised (with MPI_THREAD_MULTIPLE, for the communicators'
// threads) even for one rank, as in the trainer.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <catch2/catch.hpp>

#include "comm/mpi_init.h"

int main(int argc, char** argv) {
  mt::init_mpi(&argc, &argv);
  int rc = Catch::Session().run(argc, argv);
  MPI_Finalize();
  return rc;
}
