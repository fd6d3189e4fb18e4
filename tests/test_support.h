// Helpers shared by the unit tests. Include after <catch2/catch.hpp>.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/errors.h"

namespace mt::test {

// A path in a per-process scratch directory, e.g. /tmp/meshtrain_test_data_1234/name.
inline std::string tmp_path(const std::string& suite, const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("meshtrain_test_" + suite + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
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

}  // namespace mt::test
