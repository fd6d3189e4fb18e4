// Large files written past the page cache (checkpoints and exported weights). A buffered write copies every byte
// into page-cache pages the kernel allocates one by one: on a 2-core VM, 1.4 GB took 2.0-4.7 s of CPU time and
// 2.8-5.5 s in all with the fsync, where O_DIRECT from an aligned buffer took 0.2-0.3 s of CPU and 1.3-1.5 s (`dd`
// with oflag=direct). So the bytes go through an aligned buffer of this writer's and out with O_DIRECT; where the
// filesystem refuses O_DIRECT (at open, or at the first write) they go through the page cache.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace mt {

class DirectFileWriter {
 public:
  // Creates or truncates `path` (mode 0666 less the umask). Check ok() and error() after.
  explicit DirectFileWriter(const std::string& path);
  ~DirectFileWriter();  // closes the file if close() was not called (nothing flushed, nothing synced)
  DirectFileWriter(const DirectFileWriter&) = delete;
  DirectFileWriter& operator=(const DirectFileWriter&) = delete;

  // Appends n bytes; false once any call has failed.
  bool write(const void* p, size_t n);
  // Writes what is buffered, cuts the file to the bytes written, fsyncs and closes it; false if anything failed.
  bool close();

  bool ok() const { return error_ == 0; }
  int error() const { return error_; }  // the first failure's errno (ENOSPC for a write that wrote nothing)
  bool direct() const { return direct_; }
  uint64_t bytes() const { return bytes_; }

 private:
  bool flush(size_t n);  // writes buf_[0, n), n a multiple of the alignment unless the file is not direct
  void fail(int e);

  int fd_ = -1;
  bool direct_ = false;
  unsigned char* buf_ = nullptr;
  size_t used_ = 0;
  uint64_t bytes_ = 0;
  int error_ = 0;
};

}  // namespace mt
