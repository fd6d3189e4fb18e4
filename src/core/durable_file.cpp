// Durable small files (see durable_file.h).
#include "core/durable_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace mt {

namespace fs = std::filesystem;

void write_text_durably(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::string failed;
  int err = 0;
  auto fail = [&](const char* what, int e) {
    if (failed.empty()) failed = what, err = e;
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("open", errno);
  for (size_t done = 0; fd >= 0 && failed.empty() && done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write", n < 0 ? errno : ENOSPC);  // write returns 0 only when nothing fits
    else done += size_t(n);
  }
  if (fd >= 0 && failed.empty() && ::fsync(fd) != 0) fail("fsync", errno);
  if (fd >= 0 && ::close(fd) != 0) fail("close", errno);
  if (failed.empty() && std::rename(tmp.c_str(), path.c_str()) != 0) fail("rename", errno);
  if (!failed.empty()) {
    ::unlink(tmp.c_str());
    throw std::runtime_error(fmt::format("writing {} failed ({}): {}", path, failed, std::strerror(err)));
  }
  const int dfd = ::open(fs::path(path).parent_path().c_str(), O_RDONLY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace mt
