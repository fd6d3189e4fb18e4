// CommWork, the wait statistics and thread CPU clocks (comm_work.h).
#include "comm/comm_work.h"

#include <mpi.h>
#include <pthread.h>

#include <chrono>
#include <ctime>

#include "comm/comm_util.h"

namespace mt {

std::shared_ptr<WaitStats> make_wait_stats(const std::string& name, double timeout_s) {
  auto s = std::make_shared<WaitStats>();
  s->name = name;
  s->timeout_s = timeout_s;
  int init = 0;
  MPI_Initialized(&init);
  if (init) MPI_Comm_rank(MPI_COMM_WORLD, &s->world_rank);
  return s;
}

void CommWork::wait() {
  if (done()) return;
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::unique_lock<std::mutex> lk(m_);
    const auto ready = [&] { return done(); };
    if (s_->timeout_s > 0) {
      if (!cv_.wait_for(lk, std::chrono::duration<double>(s_->timeout_s), ready))
        watchdog_abort(s_->world_rank, kind_, seq_, s_->name,
                       std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), s_->timeout_s);
    } else {
      cv_.wait(lk, ready);
    }
  }
  s_->wait_ns.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count(),
      std::memory_order_relaxed);
}

void CommWork::complete() {
  {
    std::lock_guard<std::mutex> lk(m_);
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

double thread_cpu_us(std::thread::native_handle_type thread) {
  clockid_t clock;
  timespec ts{};
  if (pthread_getcpuclockid(thread, &clock) != 0 || clock_gettime(clock, &ts) != 0) return 0;
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

}  // namespace mt
