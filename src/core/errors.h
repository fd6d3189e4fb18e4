// InputError: a bad config, flag or input file. The programs catch it and exit with status 2; the message must
// name the key or file and what is wrong with it.
// StoppedTogether: a run-time failure every rank detects at the same point (a non-finite global loss or gradient
// norm): the ranks stop together and exit with status 1 without aborting the job, so nothing is lost in flight.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace mt {

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct StoppedTogether : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void input_error(fmt::format_string<Args...> f, Args&&... args) {
  throw InputError(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace mt
