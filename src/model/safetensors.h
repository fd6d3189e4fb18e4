// safetensors (https://github.com/huggingface/safetensors): an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the tensor bytes.
// The reader validates everything before any tensor is read: truncation, a header length past the end of
// the file, malformed JSON, unknown dtypes, offsets out of range or overlapping, and shape/size disagreement
// are refused with InputError naming the file; no read ever goes out of bounds. As the specification requires,
// the tensors must tile the data section exactly (no holes, no trailing bytes); "__metadata__" is an object of
// strings; the header is at most 100 MB (the reference implementation's limit).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/file_bytes.h"

namespace mt {

struct SafetensorInfo {
  std::string name;
  std::string dtype;  // as in the file: "F32", "BF16", "F16", "F64", "I32", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets relative to the start of the data section
};

class SafetensorsFile {
 public:
  // Reads and validates the whole file (throws InputError).
  static SafetensorsFile open(const std::string& path);
  // The same checks over a file's bytes already in memory (`path` names it in messages).
  static SafetensorsFile from_bytes(const std::string& path, std::vector<char> bytes);
  static SafetensorsFile from_bytes(const std::string& path, FileBytes bytes);  // held or mapped
  const std::string& path() const { return path_; }
  const std::vector<SafetensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorInfo* find(const std::string& name) const;  // nullptr when absent
  // Number of elements of a tensor (product of its shape; 1 for a scalar).
  static int64_t numel(const SafetensorInfo& info);
  // The tensor's raw little-endian bytes (end - begin of them), for dtypes the converters below do not cover.
  const unsigned char* data(const SafetensorInfo& info) const;
  // Converts a float tensor (F32, BF16, F16, F64) into `out` (numel elements); throws InputError for others.
  void read_as_float(const SafetensorInfo& info, float* out, int64_t numel) const;
  void read_as_double(const SafetensorInfo& info, double* out, int64_t numel) const;

 private:
  std::string path_;
  FileBytes bytes_;  // whole file
  uint64_t data_start_ = 0;
  std::vector<SafetensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct SafetensorOut {
  std::string name;
  DType dtype;  // F32, F64, BF16, F16 or I32
  std::vector<int64_t> shape;
  const void* data;  // numel * dtype_size bytes
};

// Writes tensors (in the given order) atomically: to path + ".tmp", fsynced, then renamed. Returns the file's
// size and, when `checksum` is given, stores the Checksum64 (core/checksum.h) of its bytes there.
uint64_t write_safetensors(const std::string& path, const std::vector<SafetensorOut>& tensors,
                           const std::map<std::string, std::string>& metadata = {}, uint64_t* checksum = nullptr);

}  // namespace mt
