// Measuring what taking turns on the cores costs (see time_sharing.h).
#include "plan/time_sharing.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <memory>
#include <stdexcept>

#include "core/threads.h"
#include "plan/child_process.h"
#include "plan/stage_passes.h"
#include "plan/timing.h"

namespace mt::plan {

namespace {

constexpr int kRounds = 5;  // shared rounds, each between two rounds that fill the cores

// One round: `n` children released together; their mean time per forward and backward pass, in us.
double round_us(const std::vector<std::string>& command, int n) {
  std::vector<std::unique_ptr<ChildProcess>> children;
  auto fail = [&](const char* what) {
    children.clear();  // each reaped
    throw std::runtime_error(std::string("time-sharing probe: ") + what);
  };
  for (int i = 0; i < n; ++i) {
    try {
      children.push_back(std::make_unique<ChildProcess>(command));
    } catch (const std::exception&) {
      fail("a child could not be started");
    }
  }
  for (auto& c : children)
    if (c->receive() != "ready") fail("a child failed to start");
  for (auto& c : children)
    if (!c->send("go")) fail("a child did not take its start");
  double sum = 0;
  for (auto& c : children) {
    long long passes = 0;
    double us = 0;
    if (std::sscanf(c->receive().c_str(), "%lld %lf", &passes, &us) != 2 || passes < 1)
      fail("a child failed while running");
    sum += us / double(passes);
  }
  for (auto& c : children)
    if (!c->reap()) fail("a child exited with an error");
  return sum / n;
}

}  // namespace

int time_sharing_child(const ModelConfig& model, const StageShape& shape, int threads, double seconds) {
  set_compute_threads(threads);
  StagePasses passes(model, shape);
  passes.forward(0);  // first touches of the memory
  passes.backward(0);
  std::printf("ready\n");
  std::fflush(stdout);
  char line[16];
  if (!std::fgets(line, sizeof line, stdin)) return 1;  // the parent gave up
  const auto start = Clock::now();
  long long n = 0;
  double us = 0;
  while (us < seconds * 1e6) {
    passes.forward(int(n + 1));
    passes.backward(int(n + 1) - (passes.inflight() - 1));
    ++n;
    us = us_since(start);
  }
  std::printf("%lld %.1f\n", n, us);
  std::fflush(stdout);
  return 0;
}

TimeSharing measure_time_sharing(const std::vector<std::string>& command, int copies, int baseline_copies,
                                 int threads, double cores) {
  TimeSharing t;
  t.share = std::min(1.0, std::max(cores, double(threads)) / (double(copies) * threads));
  t.full_copies = std::max(1, std::min(copies, baseline_copies));
  // A child that dies must not take the planner with it when it is told to start.
  void (*old)(int) = std::signal(SIGPIPE, SIG_IGN);
  // The machine's own speed can change from one second to the next (a VM's host), so the shared rounds alternate
  // with rounds that fill the cores, each shared one is compared with the two beside it, and the median of those
  // ratios counts.
  std::vector<double> full, shared, ratio;
  try {
    full.push_back(round_us(command, t.full_copies));
    for (int i = 0; i < kRounds; ++i) {
      shared.push_back(round_us(command, copies));
      full.push_back(round_us(command, t.full_copies));
      ratio.push_back(shared.back() / ((full[i] + full[i + 1]) / 2));
    }
  } catch (...) {
    std::signal(SIGPIPE, old);
    throw;
  }
  std::signal(SIGPIPE, old);
  t.full_us = median(full);
  t.shared_us = median(shared);
  t.ratio = median(ratio) * t.share;
  if (t.share < 1) t.slicing = std::max(0.0, (t.ratio - 1) / (1 / t.share - 1));
  return t;
}

}  // namespace mt::plan
