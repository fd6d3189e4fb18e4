// run.dir's lock and status (see run_dir.h).
#include "train/run_dir.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/durable_file.h"
#include "core/errors.h"

namespace mt {

namespace fs = std::filesystem;

int lock_run_dir(const std::string& run_dir, std::string& holder) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  const std::string path = run_dir + "/.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) input_error("run.dir: cannot open {}: {}", path, std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[256] = {};
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    ::close(fd);
    holder = n > 0 ? std::string(buf, size_t(n)) : std::string();
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    if (err != EWOULDBLOCK) input_error("run.dir: cannot lock {}: {}", path, std::strerror(err));
    if (holder.empty()) holder = "another process";
    return -1;
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string me = fmt::format("pid {} on host {}\n", ::getpid(), host);
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != ssize_t(me.size()))
    spdlog::warn("run.dir: could not record this run in {}: {}", path, std::strerror(errno));
  return fd;
}

void unlock_run_dir(int fd) {
  if (fd >= 0) ::close(fd);  // closing releases the flock
}

void write_run_status(const std::string& run_dir, const std::vector<std::string>& fields) {
  std::string text = "{\n";
  for (size_t i = 0; i < fields.size(); ++i) text += "  " + fields[i] + (i + 1 < fields.size() ? ",\n" : "\n");
  write_text_durably(run_dir + "/status.json", text + "}\n");
}

}  // namespace mt
