// CHECK failure reporting: one line naming the call, the place and the rank, then abort (never a silent hang).
#include "core/check.h"

#include <mpi.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace mt {

int world_rank_or_zero() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return 0;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

namespace {
std::atomic<CheckFailureHook> g_hook{nullptr};
std::atomic<bool> g_failed{false};
}  // namespace

void set_check_failure_hook(CheckFailureHook hook) { g_hook.store(hook); }

void check_failed(const char* cond, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "[rank %d] CHECK failed: %s at %s:%d: %s\n", world_rank_or_zero(), cond, file, line,
               msg.c_str());
  std::fflush(stderr);
  // Only the first failure runs the hook: another thread failing meanwhile, or the hook itself failing, aborts.
  const CheckFailureHook hook = g_hook.load();
  if (hook && !g_failed.exchange(true)) hook(fmt::format("CHECK failed: {}: {}", cond, msg));
  std::abort();
}

}  // namespace mt
