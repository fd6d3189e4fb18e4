// Compute threads: OpenMP (our kernels) and the BLAS library (GEMMs) share the cores of a node. Every rank gets
// cores / ranks_on_node threads for both, so ranks and libraries never oversubscribe the machine.
#pragma once

namespace mt {

// Hardware cores usable by this process / ranks on this node, at least 1.
int default_compute_threads(int ranks_on_node);

// Sets the thread count of OpenMP, Eigen (the matmul backend, on OpenMP threads) and OpenBLAS (n >= 1).
void set_compute_threads(int n);

// The thread count last set (or OpenMP's default before any call).
int compute_threads();

}  // namespace mt
