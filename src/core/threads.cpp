// Compute thread settings for OpenMP and OpenBLAS (see threads.h).
#include "core/threads.h"

#include <cblas.h>
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>

#include "core/check.h"

namespace mt {

int default_compute_threads(int ranks_on_node) {
  // omp_get_num_procs honours the process's CPU affinity mask (taskset, mpirun --bind-to), unlike
  // std::thread::hardware_concurrency.
  int procs = omp_get_num_procs();
  return std::max(1, procs / std::max(1, ranks_on_node));
}

void set_compute_threads(int n) {
  CHECK(n >= 1, "compute threads must be >= 1, got {}", n);
  omp_set_num_threads(n);
  Eigen::setNbThreads(n);  // the matmul backend (Eigen's GEMM runs on OpenMP threads)
  // OpenBLAS is still linked (CMake); its pthread pool must not add threads of its own if anything calls it.
  openblas_set_num_threads(n);
}

int compute_threads() { return omp_get_max_threads(); }

}  // namespace mt
