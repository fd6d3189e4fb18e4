// Small files that must never be seen half-written (a checkpoint's meta.json and COMPLETE, run.dir/status.json).
#pragma once
#include <string>

namespace mt {

// Writes `text` to path through a temporary file, fsynced and renamed, then fsyncs the directory. A failure throws
// naming the call that failed and its own errno (a short write on a full disk is ENOSPC), and removes the temporary
// file.
void write_text_durably(const std::string& path, const std::string& text);

}  // namespace mt
