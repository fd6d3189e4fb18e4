// Real-time priority for communication threads (realtime_threads.h).
#include "comm/realtime_threads.h"

#include <pthread.h>
#include <sched.h>

#include <cstring>
#include <thread>

namespace mt {

static int set_fifo_1() {
  sched_param p{};
  p.sched_priority = 1;
  return pthread_setschedparam(pthread_self(), SCHED_FIFO, &p);
}

bool realtime_threads_permitted(std::string* why) {
  // A thread of its own, so the caller's policy (which its later threads would inherit) is never touched.
  static const int err = [] {
    int e = 0;
    std::thread([&e] { e = set_fifo_1(); }).join();
    return e;
  }();
  if (err != 0 && why) *why = std::strerror(err);
  return err == 0;
}

void enter_comm_thread(bool realtime) {
  if (realtime) set_fifo_1();
}

}  // namespace mt
