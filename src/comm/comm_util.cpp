// The Avg division, the watchdog's abort and abort_job (comm_util.h).
#include "comm/comm_util.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace mt {

void divide_by_group_size(const Tensor& t, int p) {
  const int64_t n = t.numel();
  const float fp = static_cast<float>(p);
  if (t.dtype() == DType::F32) {
    float* x = static_cast<float*>(t.data());
    for (int64_t i = 0; i < n; ++i) x[i] /= fp;
  } else if (t.dtype() == DType::BF16) {
    uint16_t* x = static_cast<uint16_t*>(t.data());
    for (int64_t i = 0; i < n; ++i) x[i] = float_to_bf16(bf16_to_float(x[i]) / fp);
  } else {
    uint16_t* x = static_cast<uint16_t*>(t.data());
    for (int64_t i = 0; i < n; ++i) x[i] = float_to_fp16(fp16_to_float(x[i]) / fp);
  }
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
