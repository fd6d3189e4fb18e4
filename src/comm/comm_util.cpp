// The Avg division, the watchdog's abort and abort_job (comm_util.h).
#include "comm/comm_util.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "kernels/elementwise.h"

namespace mt {

void divide_by_group_size(const Tensor& t, int p) {
  if (t.numel() == 0) return;  // nothing to divide; an empty device tensor has no storage (data() is null)
  kernels::divide_(t, p);
}

void watchdog_abort(int world_rank, CommKind kind, uint64_t seq, const std::string& comm, double waited_s,
                    double timeout_s) {
  std::fprintf(stderr,
               "[rank %d] watchdog: %s #%llu on communicator '%s' not complete after waiting %.1f s "
               "(comm.timeout_s = %g); aborting the job\n",
               world_rank, comm_kind_name(kind), static_cast<unsigned long long>(seq), comm.c_str(), waited_s,
               timeout_s);
  abort_job(1);
}

void abort_job(int status) {
  std::fflush(nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the job is ending anyway
  MPI_Abort(MPI_COMM_WORLD, status);
  std::abort();
}

}  // namespace mt
