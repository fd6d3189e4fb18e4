// Helpers shared by the fuzz targets: a per-process scratch file (the readers under test take a path) and a
// failure that libFuzzer reports as a crash, for properties such as "what was written reads back the same".
#pragma once
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace mt::fuzz {

// A file private to this process in $MT_FUZZ_SCRATCH, else /dev/shm (memory), else the temp directory; removed at a
// normal exit.
inline std::string scratch_path(const char* name) {
  // Never destroyed: the atexit handler below runs after the destructors of statics constructed before it.
  static const std::string* dir = [] {
    std::error_code ec;
    const char* env = std::getenv("MT_FUZZ_SCRATCH");  // scripts/fuzz.sh's, removed by it even after a crash
    std::filesystem::path d = env && *env ? std::filesystem::path(env)
                              : std::filesystem::is_directory("/dev/shm", ec) ? std::filesystem::path("/dev/shm")
                                                                              : std::filesystem::temp_directory_path();
    d /= "meshtrain_fuzz_" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    auto* s = new std::string(d.string());
    std::atexit([] {
      std::error_code ec2;
      std::filesystem::remove_all(*dir, ec2);
    });
    return s;
  }();
  return *dir + "/" + name;
}

// Writes the fuzz input to `path` (the whole buffer, as bytes).
inline void write_file(const std::string& path, const void* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) { std::perror(path.c_str()); std::abort(); }
  if (size && std::fwrite(data, 1, size, f) != size) { std::perror(path.c_str()); std::abort(); }
  std::fclose(f);
}

// A broken invariant: libFuzzer saves the input and stops.
[[noreturn]] inline void property_failed(const std::string& what) {
  std::fprintf(stderr, "fuzz property failed: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace mt::fuzz
