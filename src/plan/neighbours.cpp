// The calibration's neighbours (see neighbours.h).
#include "plan/neighbours.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "core/threads.h"
#include "plan/child_process.h"
#include "plan/stage_passes.h"

namespace mt::plan {

namespace {

// A line from fd 0 (unbuffered reads, so that poll() tells the truth); false at its end.
bool read_line(std::string& line) {
  line.clear();
  char c = 0;
  for (;;) {
    const ssize_t n = read(0, &c, 1);
    if (n <= 0) return false;
    if (c == '\n') return true;
    line += c;
  }
}

bool stdin_ready() {
  pollfd p{0, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

}  // namespace

int neighbour_count(int world, int threads, double cores) {
  threads = std::max(1, threads);
  return std::max(0, std::min(world, int(std::max(cores, double(threads)) / threads)) - 1);
}

int neighbour_child(const ModelConfig& model, int threads) {
  set_compute_threads(threads);
  std::unique_ptr<StagePasses> passes;
  StageShape s;
  long long n = 0;
  std::string line;
  for (;;) {
    if (!passes || stdin_ready()) {
      if (!read_line(line)) return 0;  // the planner is done
      std::istringstream in(line);
      PassTimes unused;
      if (!read_shape_line(in, s, unused)) return 1;
      passes.reset();  // before the next stage's memory
      passes = std::make_unique<StagePasses>(model, s);
      for (int i = 0; i + 1 < passes->inflight(); ++i) passes->forward(i);  // fill the pipeline, as the timing does
      n = 0;
    }
    passes->forward(int(n + passes->inflight() - 1));
    passes->backward(int(n));
    if (s.split) passes->backward_weights(int(n));
    if (n++ == 0) {
      std::printf("ready\n");
      std::fflush(stdout);
    }
  }
}

Neighbours::Neighbours(std::vector<std::string> command, int count, const StageShape& first, bool verbose)
    : command_(std::move(command)), count_(count), first_(first), verbose_(verbose) {}

Neighbours::~Neighbours() { stop(); }

void Neighbours::stop() {
  children_.clear();  // each closes its stdin and is reaped
  if (started_) std::signal(SIGPIPE, old_sigpipe_);
  started_ = false;
}

void Neighbours::run(const StageShape* s) {
  if (failed_ || count_ <= 0) return;
  if (!s) {
    if (started_) return;
    s = &first_;
  }
  if (started_ && s->key() == running_.key()) return;
  try {
    if (!started_) {
      // A neighbour that dies must not take the planner with it when it is told its next shape.
      old_sigpipe_ = std::signal(SIGPIPE, SIG_IGN);
      started_ = true;
      for (int i = 0; i < count_; ++i) children_.push_back(std::make_unique<ChildProcess>(command_));
      if (verbose_)
        std::fprintf(stderr, "calibration: %d neighbour process%s computing the same passes on the other cores\n",
                     count_, count_ == 1 ? "" : "es");
    }
    const std::string line = shape_line(*s, PassTimes{});
    for (auto& c : children_)
      if (!c->send(line)) throw std::runtime_error("a neighbour did not take its shape");
    for (auto& c : children_)
      if (c->receive() != "ready") throw std::runtime_error("a neighbour failed");
    running_ = *s;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "planner: warning: %s; timing the passes without neighbours on the other cores\n", e.what());
    failed_ = true;
    stop();
  }
}

}  // namespace mt::plan
