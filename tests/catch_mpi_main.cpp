// Catch2 entry point for the unit tests: MPI is initialised even for one rank, as in the trainer.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <catch2/catch.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = Catch::Session().run(argc, argv);
  MPI_Finalize();
  return rc;
}
