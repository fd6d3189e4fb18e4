// Agreeing on set-up errors (see agree_on_setup.h).
#include "comm/agree_on_setup.h"

#include <spdlog/spdlog.h>

#include "comm/mpi_init.h"
#include "core/check.h"

namespace mt {

void agree_on_setup(const std::string& error, MPI_Comm world) {
  const int failed = error.empty() ? 0 : 1, any = allreduce_int_yielding(failed, MPI_MAX, world);
  if (!any) return;
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  if (failed && rank != 0) spdlog::error("[rank {}] {}", rank, error);  // the caller prints rank 0's message
  throw SetupError(failed ? error : "stopped: another rank's set-up failed (its message says why)");
}

}  // namespace mt
