// Compute threads: our kernels and Eigen's GEMM share one OpenMP team per rank. Every rank gets
// cores / ranks_on_node threads, so ranks never oversubscribe the machine.
#pragma once
#include <vector>

namespace mt {

// OMP_NUM_THREADS when set, else hardware cores usable by this process / ranks on this node; at least 1.
int default_compute_threads(int ranks_on_node);

// The size in bytes of CPU 0's highest-level data or unified cache, as Linux reports it under
// /sys/devices/system/cpu/cpu0/cache (glibc's sysconf, from CPUID, can give the whole socket's where a VM sees a
// part: 384 MiB against 32 on a 2-core Zen 5 VM); 0 where unknown.
long long last_level_cache_bytes();

// Sets the thread count of OpenMP and Eigen (the matmul backend, on OpenMP threads); n >= 1.
void set_compute_threads(int n);

// The thread count last set (or OpenMP's default before any call).
int compute_threads();

// Core pinning (train.pin_threads). Why: when a job's compute threads fill the node's cores, a pinned one keeps
// its caches, and a rank's short-lived communication threads, kept on that rank's own cores, delay only their
// own rank's compute instead of another rank's (a pipeline's critical path); unpinned, the scheduler moves them
// around (measured in docs/performance.md).
// The CPUs [first, first + n) of those this process may use; empty when there are too few.
std::vector<int> rank_cores(int first, int n);
// Restricts the calling thread, and so every thread it creates afterwards (communication threads), to `cpus`.
void bind_calling_thread(const std::vector<int>& cpus);
// Pins the compute threads (the calling thread and its OpenMP team, compute_threads() of them) one per core of
// `cpus`, in order; OpenMP keeps these threads for every later parallel region, Eigen's included.
void pin_compute_threads(const std::vector<int>& cpus);

}  // namespace mt
