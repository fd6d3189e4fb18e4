// The Avg division, the watchdog's abort and abort_job (comm_util.h).
#include "comm/comm_util.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "comm/flight_recorder.h"
#include "kernels/elementwise.h"

namespace mt {

void divide_by_group_size(const Tensor& t, int p) {
  if (t.numel() == 0) return;  // nothing to divide; an empty device tensor has no storage (data() is null)
  kernels::divide_(t, p);
}

void watchdog_abort(int world_rank, CommKind kind, uint64_t seq, const std::string& comm, double waited_s,
                    double timeout_s) {
  char line[512];
  std::snprintf(line, sizeof line, "watchdog: %s #%llu on communicator '%s' not complete after waiting %.1f s "
                "(comm.timeout_s = %g)", comm_kind_name(kind), static_cast<unsigned long long>(seq), comm.c_str(),
                waited_s, timeout_s);
  abort_job_with_dumps(world_rank, line);
}

void abort_job_with_dumps(int world_rank, const std::string& line) {
  std::fprintf(stderr, "[rank %d] %s; aborting the job\n", world_rank, line.c_str());
  std::fflush(stderr);
  // Every rank's last operations on disk before the job ends (the peers' listeners dump on request).
  const std::string flight = flight_dump_on_timeout(line);
  if (!flight.empty()) std::fprintf(stderr, "[rank %d] %s\n", world_rank, flight.c_str());
  abort_job(1);
}

void abort_job(int status) {
  std::fflush(nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the job is ending anyway
  MPI_Abort(MPI_COMM_WORLD, status);
  std::abort();
}

bool finalized_before_free(const std::string& what) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized)
    std::fprintf(stderr, "meshtrain: %s outlived MPI_Finalize, so its MPI objects leak (free it before finalize_mpi)\n",
                 what.c_str());
  return finalized;
}

}  // namespace mt
