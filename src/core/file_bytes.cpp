// Files mapped or held in memory (see file_bytes.h).
#include "core/file_bytes.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace mt {

FileBytes::FileBytes(std::vector<char> bytes) {
  auto held = std::make_shared<std::vector<char>>(std::move(bytes));
  size_ = held->size();
  data_ = std::shared_ptr<const char>(held, held->data());
}

FileBytes FileBytes::map(const std::string& path) {
  auto fail = [&](const char* call) {
    return std::runtime_error(fmt::format("{} of {} failed: {}", call, path, std::strerror(errno)));
  };
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw fail("open");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const auto e = fail("fstat");
    ::close(fd);
    throw e;
  }
  FileBytes f;
  f.size_ = uint64_t(st.st_size);
  if (f.size_ == 0) {  // nothing to map (mmap refuses a length of 0)
    ::close(fd);
    return FileBytes(std::vector<char>());
  }
  void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file
  if (p == MAP_FAILED) {
    errno = err;
    throw fail("mmap");
  }
  ::madvise(p, f.size_, MADV_SEQUENTIAL);  // read once front to back for its checksum: read ahead
  const size_t n = f.size_;
  f.data_ = std::shared_ptr<const char>(static_cast<const char*>(p), [n](const char* q) {
    ::munmap(const_cast<char*>(q), n);
  });
  return f;
}

}  // namespace mt
