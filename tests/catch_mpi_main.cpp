// Catch2 entry point for the unit tests: MPI is initialised (with MPI_THREAD_MULTIPLE, for the communicators'
// threads) even for one rank, as in the trainer. Compiled a second time with MESHTRAIN_TESTS_NEED_GPU for the
// GPU tests (tests/test_cuda_*.cpp): where no GPU can be used they exit with 77, which ctest reports as skipped
// (SKIP_RETURN_CODE), and otherwise each rank takes the GPU of its node-local rank.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>

#include "comm/mpi_init.h"
#include "core/device.h"

int main(int argc, char** argv) {
  mt::init_mpi(&argc, &argv);
#ifdef MESHTRAIN_TESTS_NEED_GPU
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing |= std::strncmp(argv[i], "--list", 6) == 0;
  if (!listing) {
    const mt::NodeRanks node = mt::node_ranks();
    if (!mt::cuda_available()) {
      if (node.local_rank == 0)
        std::printf("skipped: %s\n", mt::cuda_built() ? "no usable GPU" : "built without the CUDA backend");
      MPI_Finalize();
      return 77;
    }
    mt::cuda_init(node.local_rank);
  }
#endif
  int rc = Catch::Session().run(argc, argv);
  MPI_Finalize();
  return rc;
}
