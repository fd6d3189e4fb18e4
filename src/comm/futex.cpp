// futex_wait / futex_wake_all over the raw system call (futex.h).
#include "comm/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace mt {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free,
              "a futex word must be a plain lock-free 32-bit integer");

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, double timeout_us) {
  timespec ts{};
  timespec* limit = nullptr;
  if (timeout_us >= 0) {
    const long long ns = static_cast<long long>(timeout_us * 1e3);
    ts.tv_sec = ns / 1000000000LL;
    ts.tv_nsec = ns % 1000000000LL;
    limit = &ts;
  }
  // EAGAIN (the word already differs), EINTR and ETIMEDOUT all mean: look again.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, limit, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace mt
