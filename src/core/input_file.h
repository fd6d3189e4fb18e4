// Input files are read whole, so each must be a regular file: checked with stat before it is opened, since opening
// a FIFO waits for a writer and a device such as /dev/zero never ends, either of which would hang the run.
#pragma once
#include <filesystem>
#include <string>

#include "core/errors.h"

namespace mt {

// Throws InputError naming `what` and the path when it exists and is not a regular file (a missing file is left
// to the open that follows, which reports it).
inline void require_regular_file(const std::string& path, const char* what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status s = fs::status(path, ec);
  if (ec || s.type() == fs::file_type::not_found || s.type() == fs::file_type::regular) return;
  const char* kind = s.type() == fs::file_type::directory   ? "a directory"
                     : s.type() == fs::file_type::fifo      ? "a FIFO (named pipe)"
                     : s.type() == fs::file_type::character ? "a character device"
                     : s.type() == fs::file_type::block     ? "a block device"
                     : s.type() == fs::file_type::socket    ? "a socket"
                                                            : "not a regular file";
  input_error("{} '{}' is {}, not a regular file: it is read whole", what, path, kind);
}

}  // namespace mt
