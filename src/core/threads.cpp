// Compute thread settings for OpenMP and Eigen (see threads.h).
#include "core/threads.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/check.h"

namespace mt {

long long last_level_cache_bytes() {
  int best_level = 0;
  long long best = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level(dir + "level"), type(dir + "type"), size(dir + "size");
    int l = 0;
    std::string t, sz;
    if (!(level >> l) || !(type >> t) || !(size >> sz)) continue;
    if (t == "Instruction" || sz.empty()) continue;
    long long bytes = std::atoll(sz.c_str());
    const char unit = sz.back();
    bytes *= unit == 'K' ? 1024LL : unit == 'M' ? 1048576LL : unit == 'G' ? 1073741824LL : 1LL;
    if (l > best_level) best_level = l, best = bytes;
  }
  return best;
}

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

std::vector<int> rank_cores(int first, int n) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return {};
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  if (first < 0 || n < 1 || first + n > static_cast<int>(cpus.size())) return {};
  return std::vector<int>(cpus.begin() + first, cpus.begin() + first + n);
}

static void bind_thread(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

void bind_calling_thread(const std::vector<int>& cpus) {
  if (!cpus.empty()) bind_thread(cpus);
}

void pin_compute_threads(const std::vector<int>& cpus) {
  const int n = compute_threads();
  CHECK(static_cast<int>(cpus.size()) >= n, "pinning {} compute threads to {} cpus", n, cpus.size());
#pragma omp parallel num_threads(n)
  bind_thread({cpus[omp_get_thread_num()]});
}

}  // namespace mt
