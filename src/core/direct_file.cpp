// Large files through O_DIRECT (see direct_file.h).
#include "core/direct_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace mt {

namespace {
// O_DIRECT wants the buffer's address, the length and the file offset aligned to the device's logical block (512
// or 4096 bytes): 4096 suits both. 8 MiB per write keeps the disk busy and the buffer small.
constexpr size_t kAlign = 4096, kBuffer = size_t(8) << 20;
}  // namespace

DirectFileWriter::DirectFileWriter(const std::string& path) {
  buf_ = static_cast<unsigned char*>(std::aligned_alloc(kAlign, kBuffer));
  if (!buf_) {
    fail(ENOMEM);
    return;
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0666);
  direct_ = fd_ >= 0;
  if (fd_ < 0 && errno == EINVAL) fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
  if (fd_ < 0) fail(errno);
}

DirectFileWriter::~DirectFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  std::free(buf_);
}

void DirectFileWriter::fail(int e) {
  if (error_ == 0) error_ = e;
}

bool DirectFileWriter::flush(size_t n) {
  for (size_t done = 0; ok() && done < n;) {
    const ssize_t w = ::write(fd_, buf_ + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    // A filesystem that took O_DIRECT at open but not at the write: the page cache from here on. Nothing was
    // written by the refused call, and the offset so far is aligned.
    if (w < 0 && errno == EINVAL && direct_ && done % kAlign == 0) {
      direct_ = false;
      const int flags = ::fcntl(fd_, F_GETFL);
      if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) fail(errno);
      continue;
    }
    if (w <= 0) fail(w < 0 ? errno : ENOSPC);  // write returns 0 only when nothing fits
    else done += size_t(w);
  }
  return ok();
}

bool DirectFileWriter::write(const void* p, size_t n) {
  const unsigned char* src = static_cast<const unsigned char*>(p);
  while (ok() && n > 0) {
    const size_t take = std::min(n, kBuffer - used_);
    std::memcpy(buf_ + used_, src, take);
    used_ += take, src += take, n -= take, bytes_ += take;
    if (used_ == kBuffer && flush(kBuffer)) used_ = 0;
  }
  return ok();
}

bool DirectFileWriter::close() {
  if (fd_ < 0) return false;
  if (ok() && used_ > 0) {
    // The tail, padded to the alignment under O_DIRECT, then cut back to the bytes written.
    const size_t padded = direct_ ? (used_ + kAlign - 1) / kAlign * kAlign : used_;
    std::memset(buf_ + used_, 0, padded - used_);
    if (flush(padded) && padded != used_ && ::ftruncate(fd_, off_t(bytes_)) != 0) fail(errno);
  }
  if (ok() && ::fsync(fd_) != 0) fail(errno);
  if (::close(fd_) != 0) fail(errno);
  fd_ = -1;
  return ok();
}

}  // namespace mt
