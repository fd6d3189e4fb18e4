// Measuring what taking turns on the cores costs (see time_sharing.h).
#include "plan/time_sharing.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <stdexcept>

#include "core/threads.h"
#include "plan/stage_passes.h"
#include "plan/timing.h"

extern char** environ;

namespace mt::plan {

namespace {

constexpr int kRounds = 5;  // shared rounds, each between two rounds alone

struct Child {
  pid_t pid = -1;
  int to = -1;          // its stdin
  FILE* from = nullptr;  // its stdout
};

Child spawn(const std::vector<std::string>& command) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) throw std::runtime_error("time-sharing probe: pipe failed");
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]), close(in[1]);
    throw std::runtime_error("time-sharing probe: pipe failed");
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);  // dup2 clears close-on-exec on 0 and 1
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  Child c;
  const int rc = posix_spawn(&c.pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  if (rc != 0) {
    close(in[1]), close(out[0]);
    throw std::runtime_error("time-sharing probe: cannot start " + command[0]);
  }
  c.to = in[1];
  c.from = fdopen(out[0], "r");
  return c;
}

// Closing a child's stdin ends it if it still waits there; then its exit status.
bool reap(Child& c) {
  if (c.to >= 0) close(c.to);
  if (c.from) std::fclose(c.from);
  c.to = -1;
  c.from = nullptr;
  int status = 0;
  return waitpid(c.pid, &status, 0) == c.pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// One round: `n` children released together; their mean time per forward and backward pass, in us.
double round_us(const std::vector<std::string>& command, int n) {
  std::vector<Child> children;
  auto fail = [&](const char* what) {
    for (Child& c : children) reap(c);
    throw std::runtime_error(std::string("time-sharing probe: ") + what);
  };
  for (int i = 0; i < n; ++i) {
    try {
      children.push_back(spawn(command));
    } catch (const std::exception&) {
      fail("a child could not be started");
    }
  }
  char line[256];
  for (Child& c : children)
    if (!std::fgets(line, sizeof line, c.from) || std::string(line) != "ready\n") fail("a child failed to start");
  for (Child& c : children)
    if (write(c.to, "go\n", 3) != 3) fail("a child did not take its start");
  double sum = 0;
  for (Child& c : children) {
    long long passes = 0;
    double us = 0;
    if (!std::fgets(line, sizeof line, c.from) || std::sscanf(line, "%lld %lf", &passes, &us) != 2 || passes < 1)
      fail("a child failed while running");
    sum += us / double(passes);
  }
  for (Child& c : children)
    if (!reap(c)) fail("a child exited with an error");
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

TimeSharing measure_time_sharing(const std::vector<std::string>& command, int copies, int threads, double cores) {
  TimeSharing t;
  t.share = std::min(1.0, std::max(cores, double(threads)) / (double(copies) * threads));
  // A child that dies must not take the planner with it when it is told to start.
  void (*old)(int) = std::signal(SIGPIPE, SIG_IGN);
  // The machine's own speed can change from one second to the next (a VM's host), so the shared rounds alternate
  // with rounds alone, each shared one is compared with the two beside it, and the median of those ratios counts.
  std::vector<double> alone, shared, ratio;
  try {
    alone.push_back(round_us(command, 1));
    for (int i = 0; i < kRounds; ++i) {
      shared.push_back(round_us(command, copies));
      alone.push_back(round_us(command, 1));
      ratio.push_back(shared.back() / ((alone[i] + alone[i + 1]) / 2));
    }
  } catch (...) {
    std::signal(SIGPIPE, old);
    throw;
  }
  std::signal(SIGPIPE, old);
  t.alone_us = median(alone);
  t.shared_us = median(shared);
  t.ratio = median(ratio) * t.share;
  if (t.share < 1) t.slicing = std::max(0.0, (t.ratio - 1) / (1 / t.share - 1));
  return t;
}

}  // namespace mt::plan
