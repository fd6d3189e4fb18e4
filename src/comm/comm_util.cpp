// The Avg division and the watchdog's abort (comm_util.h).
#include "comm/comm_util.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

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
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

}  // namespace mt
