// Stop signals: recorded by the handler, agreed on at step boundaries (stop_signal.h).
#include "train/stop_signal.h"

#include <time.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

#include <algorithm>
#include <cctype>
#include <sstream>

#include "comm/flight_recorder.h"

namespace mt {

namespace {

volatile std::sig_atomic_t g_received = 0;
timespec g_received_at{};  // written by the handler before g_received

double now_s(const timespec& t) { return double(t.tv_sec) + 1e-9 * double(t.tv_nsec); }

const std::pair<const char*, int> kNames[] = {
    {"TERM", SIGTERM}, {"INT", SIGINT}, {"HUP", SIGHUP}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}};

// Async-signal-safe: the first signal is recorded; a second one (any stop signal) ends the process as that signal
// would have without a handler.
void on_stop_signal(int sig) {
  if (g_received == 0) {
    clock_gettime(CLOCK_MONOTONIC, &g_received_at);  // async-signal-safe
    g_received = sig;
    return;
  }
  std::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

bool parse_stop_signals(const std::string& list, std::vector<int>& out, std::string& bad) {
  out.clear();
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    std::string name;
    for (char ch : item)
      if (!std::isspace(static_cast<unsigned char>(ch))) name += static_cast<char>(std::toupper(ch));
    if (name.empty() && list.find_first_not_of(" \t") == std::string::npos) continue;  // "" = none
    if (name.rfind("SIG", 0) == 0) name = name.substr(3);
    int sig = 0;
    for (const auto& [n, s] : kNames)
      if (name == n) sig = s;
    if (sig == 0) {
      bad = item;
      return false;
    }
    if (std::find(out.begin(), out.end(), sig) == out.end()) out.push_back(sig);
  }
  return true;
}

std::string signal_name(int sig) {
  for (const auto& [n, s] : kNames)
    if (s == sig) return std::string("SIG") + n;
  return "signal " + std::to_string(sig);
}

void install_stop_signals(const std::vector<int>& signals) {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls of the other threads carry on; the loop polls the flag
  for (int sig : signals) sigaction(sig, &sa, nullptr);
}

int stop_signal_received() { return g_received; }

double seconds_since_stop_signal() {
  if (!g_received) return 0;
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return now_s(now) - now_s(g_received_at);
}

StopVote::StopVote(Communicator* world, int lag) : world_(world && world->size() > 1 ? world : nullptr), lag_(lag) {
  for (int i = 0; i <= lag_; ++i) votes_.push_back(Tensor::zeros({1}, DType::F32));
  work_.resize(votes_.size());
}

StopVote::~StopVote() {
  for (auto& w : work_)
    if (w) w->wait();
}

int StopVote::cast() {
  if (!world_) return stop_signal_received();
  const size_t slot = size_t(cast_ % int64_t(votes_.size()));
  static_cast<float*>(votes_[slot].data())[0] = float(stop_signal_received());
  FlightSite site("stop vote");
  work_[slot] = world_->all_reduce_async(votes_[slot], ReduceOp::Max);
  ++cast_;
  if (cast_ <= lag_) return 0;
  const size_t old = size_t((cast_ - 1 - lag_) % int64_t(votes_.size()));
  work_[old]->wait();
  work_[old].reset();
  return int(static_cast<const float*>(votes_[old].data())[0]);
}

}  // namespace mt
