// Compute threads: our kernels and Eigen's GEMM share one OpenMP team per rank. Every rank gets
// cores / ranks_on_node threads, so ranks never oversubscribe the machine.
#pragma once

namespace mt {

// OMP_NUM_THREADS when set, else hardware cores usable by this process / ranks on this node; at least 1.
int default_compute_threads(int ranks_on_node);

// Sets the thread count of OpenMP and Eigen (the matmul backend, on OpenMP threads); n >= 1.
void set_compute_threads(int n);

// The thread count last set (or OpenMP's default before any call).
int compute_threads();

}  // namespace mt
