// InputError: a bad config, flag or input file. The programs catch it and exit with status 2; the message must
// name the key or file and what is wrong with it.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace mt {

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void input_error(fmt::format_string<Args...> f, Args&&... args) {
  throw InputError(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace mt
