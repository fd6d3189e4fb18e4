// Catch2's implementation and the tests' session (see catch_session.h). Catch2 v2 is a single header whose
// implementation takes most of a minute to compile, so it lives in this one object.
#define CATCH_CONFIG_RUNNER
#include "catch_session.h"

#include <mpi.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>

#include "comm/mpi_init.h"
#include "core/device.h"

int run_catch_session(int argc, char** argv, bool need_gpu) {
  mt::init_mpi(&argc, &argv);
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing |= std::strncmp(argv[i], "--list", 6) == 0;
  if (need_gpu && !listing) {
    const mt::NodeRanks node = mt::node_ranks();
    if (!mt::cuda_available()) {
      if (node.local_rank == 0)
        std::printf("skipped: %s\n", mt::cuda_built() ? "no usable GPU" : "built without the CUDA backend");
      MPI_Finalize();
      return 77;
    }
    mt::cuda_init(node.local_rank);
  }
  int rc = Catch::Session().run(argc, argv);
  MPI_Finalize();
  return rc;
}
