// Helpers shared by the unit tests. Include after <catch2/catch.hpp>.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/tensor.h"

namespace mt::test {

// A per-process scratch directory, e.g. /tmp/meshtrain_test_data_1234, created on first use and removed with
// everything in it when the process exits normally (a test process that aborts leaves it for inspection).
inline std::filesystem::path scratch_dir(const std::string& suite) {
  struct Made {
    std::vector<std::filesystem::path> dirs;
    ~Made() {
      for (const auto& d : dirs) {
        std::error_code ignored;  // a test may have removed it already
        std::filesystem::remove_all(d, ignored);
      }
    }
  };
  static Made made;
  auto dir = std::filesystem::temp_directory_path() / ("meshtrain_test_" + suite + "_" + std::to_string(::getpid()));
  if (std::filesystem::create_directories(dir)) made.dirs.push_back(dir);
  return dir;
}

// A path in the per-process scratch directory of `suite`, e.g. /tmp/meshtrain_test_data_1234/name.
inline std::string tmp_path(const std::string& suite, const std::string& name) {
  return (scratch_dir(suite) / name).string();
}

// Runs f, which must throw InputError whose message contains every one of `parts`.
template <typename F>
void require_input_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const InputError& e) {
    const std::string msg = e.what();
    INFO("message: " << msg);
    for (const auto& p : parts) CHECK(msg.find(p) != std::string::npos);
    return;
  }
  FAIL("expected InputError mentioning " << parts.at(0));
}

// An fp64 input of a finite-difference check and its analytic gradient.
struct GradParam {
  std::string name;
  Tensor x, grad;
};

// Central-difference check of analytic gradients: `loss` recomputes the scalar loss from the current inputs.
// Tolerance: with h = 1e-6 * max(1, |x|), the truncation error is O(h^2 |L'''|) ~ 1e-12 and the rounding error is
// O(eps |L| / h) ~ 2e-16 * 20 / 1e-6 = 4e-9, so |numeric - analytic| <= 1e-6 * max(1, |analytic|) holds with a
// margin of ~250x while any indexing or formula bug gives errors of order 1e-3 .. 1.
inline void gradcheck(const std::function<double()>& loss, const std::vector<GradParam>& params) {
  for (const GradParam& p : params) {
    double* x = p.x.data_as<double>();
    const double* g = p.grad.data_as<double>();
    for (int64_t i = 0; i < p.x.numel(); ++i) {
      const double x0 = x[i], h = 1e-6 * std::max(1.0, std::abs(x0));
      x[i] = x0 + h;
      const double lp = loss();
      x[i] = x0 - h;
      const double lm = loss();
      x[i] = x0;
      const double num = (lp - lm) / (2 * h);
      INFO(p.name << "[" << i << "]: analytic " << g[i] << ", numeric " << num);
      REQUIRE(std::abs(num - g[i]) <= 1e-6 * std::max(1.0, std::abs(g[i])));
    }
  }
}

// MT_CHECK aborts the process: runs f in a forked child with stderr in a file (`suite` names its folder); returns
// what it printed when it aborted, "" when it did not. f must abort before any OpenMP region (fork keeps one thread).
inline std::string abort_message(const std::string& suite, const std::function<void()>& f) {
  const std::string path = tmp_path(suite, "stderr.txt");
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::signal(SIGABRT, SIG_DFL);  // not Catch2's fatal-signal handler: the child must just die
    // Without the file the message cannot be read back: exit instead of aborting, so that the caller sees "".
    if (!std::freopen("/dev/null", "w", stdout) || !std::freopen(path.c_str(), "w", stderr)) ::_exit(125);
    f();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  std::string printed;
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT) {
    std::ifstream in(path);
    printed.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return printed;
}

}  // namespace mt::test
