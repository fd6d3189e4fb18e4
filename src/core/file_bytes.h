// A file's bytes in memory, read-only: mapped where the file can be (the page cache's pages themselves, neither
// zeroed first nor copied as a read into a buffer does), or held in a buffer. A checkpoint's rank files are read so:
// reading GPT-2 124M's 1.4 GB into buffers spent a third of the load's time zeroing and copying pages.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mt {

class FileBytes {
 public:
  FileBytes() = default;
  explicit FileBytes(std::vector<char> bytes);
  // Maps the regular file at `path` (throws std::runtime_error naming the call and errno where that fails).
  static FileBytes map(const std::string& path);
  const char* data() const { return data_.get(); }
  uint64_t size() const { return size_; }

 private:
  std::shared_ptr<const char> data_;
  uint64_t size_ = 0;
};

}  // namespace mt
