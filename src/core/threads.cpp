// Compute thread settings for OpenMP and Eigen (see threads.h).
#include "core/threads.h"

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstdlib>

#include "core/check.h"

namespace mt {

int default_compute_threads(int ranks_on_node) {
  // An explicit OMP_NUM_THREADS wins: test runners and job scripts use it to share a node.
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n >= 1) return n;
  }
  // omp_get_num_procs honours the process's CPU affinity mask (taskset, mpirun --bind-to), unlike
  // std::thread::hardware_concurrency.
  int procs = omp_get_num_procs();
  return std::max(1, procs / std::max(1, ranks_on_node));
}

void set_compute_threads(int n) {
  CHECK(n >= 1, "compute threads must be >= 1, got {}", n);
  omp_set_num_threads(n);
  Eigen::setNbThreads(n);  // the matmul backend (Eigen's GEMM runs on OpenMP threads)
}

int compute_threads() { return omp_get_max_threads(); }

}  // namespace mt
