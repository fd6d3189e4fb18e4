// safetensors reader and writer (format: https://github.com/huggingface/safetensors). The reader checks the
// whole header against the file before any tensor is touched; every range it later reads was proven in
// bounds then. The writer emits what the reference implementation emits: compact JSON, "__metadata__" first,
// the header padded with spaces to a multiple of 8 bytes, tensors packed back to back with no holes.
#include "model/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <unistd.h>

#include "core/checksum.h"
#include "core/direct_file.h"
#include "core/errors.h"
#include "core/input_file.h"
#include "core/json.h"

namespace mt {

namespace {

constexpr uint64_t kMaxHeader = 100000000;  // the reference implementation's limit (100 MB)

// Element sizes of the dtypes of the safetensors specification (sub-byte F4/F6 types are not supported).
int64_t st_dtype_size(const std::string& d) {
  static const std::pair<const char*, int64_t> table[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},     {"F64", 8},
      {"I64", 8},  {"U64", 8}, {"C64", 8}};
  for (const auto& e : table)
    if (d == e.first) return e.second;
  return 0;
}

const char* st_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
  }
  return "?";
}

uint64_t le_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// numel of a validated shape, or -1 when it overflows int64.
int64_t checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > INT64_MAX / d) return -1;
    n *= d;
  }
  return n;
}

template <typename T>
void decode(const std::string& dtype, const unsigned char* p, int64_t numel, T* out) {
  if (dtype == "F32") {
    for (int64_t i = 0; i < numel; ++i) {
      uint32_t u = static_cast<uint32_t>(p[4 * i]) | (static_cast<uint32_t>(p[4 * i + 1]) << 8) |
                   (static_cast<uint32_t>(p[4 * i + 2]) << 16) | (static_cast<uint32_t>(p[4 * i + 3]) << 24);
      out[i] = static_cast<T>(bits_float(u));
    }
  } else if (dtype == "F64") {
    for (int64_t i = 0; i < numel; ++i) {
      uint64_t u = le_u64(p + 8 * i);
      double d;
      std::memcpy(&d, &u, 8);
      out[i] = static_cast<T>(d);
    }
  } else {  // BF16 or F16
    const bool bf = dtype == "BF16";
    for (int64_t i = 0; i < numel; ++i) {
      uint16_t h = static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8));
      out[i] = static_cast<T>(bf ? bf16_to_float(h) : fp16_to_float(h));
    }
  }
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  require_regular_file(path, "safetensors file");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) input_error("safetensors file '{}': cannot open the file (missing or unreadable)", path);
  const std::streamoff size = in.tellg();
  if (size < 0) input_error("safetensors file '{}': not a regular file (its size cannot be read)", path);
  std::vector<char> bytes(static_cast<size_t>(size));
  in.seekg(0);
  if (!in.read(bytes.data(), static_cast<std::streamsize>(bytes.size())))
    input_error("safetensors file '{}': read error", path);
  return from_bytes(path, std::move(bytes));
}

SafetensorsFile SafetensorsFile::from_bytes(const std::string& path, std::vector<char> bytes) {
  return from_bytes(path, FileBytes(std::move(bytes)));
}

SafetensorsFile SafetensorsFile::from_bytes(const std::string& path, FileBytes bytes) {
  SafetensorsFile f;
  f.path_ = path;
  f.bytes_ = std::move(bytes);
  const uint64_t size = f.bytes_.size();
  const auto* b = reinterpret_cast<const unsigned char*>(f.bytes_.data());
  if (size < 8) input_error("safetensors file '{}': {} bytes, shorter than the 8-byte header length", path, size);
  const uint64_t n = le_u64(b);
  if (n == 0) input_error("safetensors file '{}': header length is 0", path);
  if (n > kMaxHeader) input_error("safetensors file '{}': header length {} exceeds the {}-byte limit", path, n, kMaxHeader);
  if (n > size - 8)
    input_error("safetensors file '{}': header length {} runs past the end of the file ({} bytes)", path, n, size);
  f.data_start_ = 8 + n;
  const uint64_t data_size = size - f.data_start_;

  Json h;
  try {
    h = parse_json(std::string_view(f.bytes_.data() + 8, n));
  } catch (const JsonError& e) {
    input_error("safetensors file '{}': the header is not valid JSON ({})", path, e.what());
  }
  if (!h.is_object()) input_error("safetensors file '{}': the header is {}, not a JSON object", path, h.type_name());

  for (const auto& [name, v] : h.object) {
    if (name == "__metadata__") {
      if (!v.is_object())
        input_error("safetensors file '{}': \"__metadata__\" is {}, not an object of strings", path, v.type_name());
      for (const auto& [k, mv] : v.object) {
        if (!mv.is_string())
          input_error("safetensors file '{}': \"__metadata__\" entry '{}' is {}, not a string", path, k,
                      mv.type_name());
        f.metadata_[k] = mv.string;
      }
      continue;
    }
    if (!v.is_object())
      input_error("safetensors file '{}': tensor '{}': the entry is {}, not an object", path, name, v.type_name());
    const Json* dt = v.get("dtype");
    const Json* sh = v.get("shape");
    const Json* off = v.get("data_offsets");
    if (!dt) input_error("safetensors file '{}': tensor '{}': missing \"dtype\"", path, name);
    if (!sh) input_error("safetensors file '{}': tensor '{}': missing \"shape\"", path, name);
    if (!off) input_error("safetensors file '{}': tensor '{}': missing \"data_offsets\"", path, name);
    if (!dt->is_string())
      input_error("safetensors file '{}': tensor '{}': \"dtype\" is {}, not a string", path, name, dt->type_name());
    const int64_t esize = st_dtype_size(dt->string);
    if (esize == 0) input_error("safetensors file '{}': tensor '{}': unknown dtype '{}'", path, name, dt->string);
    if (!sh->is_array())
      input_error("safetensors file '{}': tensor '{}': \"shape\" is {}, not an array", path, name, sh->type_name());
    SafetensorInfo info;
    info.name = name;
    info.dtype = dt->string;
    for (size_t i = 0; i < sh->array.size(); ++i) {
      const Json& d = sh->array[i];
      if (!d.is_uint() || d.integer > static_cast<uint64_t>(INT64_MAX))
        input_error("safetensors file '{}': tensor '{}': shape[{}] is not a non-negative integer", path, name, i);
      info.shape.push_back(static_cast<int64_t>(d.integer));
    }
    if (!off->is_array() || off->array.size() != 2)
      input_error("safetensors file '{}': tensor '{}': \"data_offsets\" must be an array [begin, end]", path, name);
    for (int i = 0; i < 2; ++i)
      if (!off->array[static_cast<size_t>(i)].is_uint())
        input_error("safetensors file '{}': tensor '{}': data_offsets[{}] is not a non-negative integer", path, name,
                    i);
    info.begin = off->array[0].integer;
    info.end = off->array[1].integer;
    if (info.begin > info.end)
      input_error("safetensors file '{}': tensor '{}': data_offsets begin {} > end {}", path, name, info.begin,
                  info.end);
    if (info.end > data_size)
      input_error("safetensors file '{}': tensor '{}': data_offsets end {} is past the data section ({} bytes)",
                  path, name, info.end, data_size);
    const int64_t numel = checked_numel(info.shape);
    if (numel < 0 || static_cast<uint64_t>(numel) > data_size / static_cast<uint64_t>(esize) + 1 ||
        info.end - info.begin != static_cast<uint64_t>(numel) * static_cast<uint64_t>(esize))
      input_error("safetensors file '{}': tensor '{}': data_offsets span {} bytes, but shape {} of dtype {} needs "
                  "{} elements x {} bytes",
                  path, name, info.end - info.begin, shape_str(info.shape), info.dtype,
                  numel < 0 ? std::string("more than 2^63") : std::to_string(numel), esize);
    f.tensors_.push_back(std::move(info));
  }

  // Ranges must not overlap, and (as the specification and reference implementation require) must cover the
  // data section with no holes, so no byte of the file goes unaccounted for.
  std::vector<const SafetensorInfo*> order;
  for (const auto& t : f.tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const SafetensorInfo* a, const SafetensorInfo* c) {
    return a->begin != c->begin ? a->begin < c->begin : a->end < c->end;
  });
  uint64_t pos = 0;
  const SafetensorInfo* prev = nullptr;
  for (const SafetensorInfo* t : order) {
    if (t->begin < pos)
      input_error("safetensors file '{}': tensor '{}' (bytes {}..{}) overlaps tensor '{}' (bytes {}..{})", path,
                  t->name, t->begin, t->end, prev->name, prev->begin, prev->end);
    if (t->begin > pos)
      input_error("safetensors file '{}': tensor '{}' starts at byte {} of the data section, leaving a hole after "
                  "byte {}",
                  path, t->name, t->begin, pos);
    pos = t->end;
    prev = t;
  }
  if (pos != data_size)
    input_error("safetensors file '{}': the tensors cover {} bytes but the data section has {} (trailing bytes)",
                path, pos, data_size);
  return f;
}

const SafetensorInfo* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

int64_t SafetensorsFile::numel(const SafetensorInfo& info) { return checked_numel(info.shape); }

const unsigned char* SafetensorsFile::data(const SafetensorInfo& info) const {
  if (info.begin > info.end || data_start_ + info.end > bytes_.size())
    input_error("safetensors file '{}': tensor '{}' is not a tensor of this file", path_, info.name);
  return reinterpret_cast<const unsigned char*>(bytes_.data()) + data_start_ + info.begin;
}

namespace {

void check_float_read(const std::string& path, const SafetensorInfo& info, int64_t numel) {
  if (info.dtype != "F32" && info.dtype != "BF16" && info.dtype != "F16" && info.dtype != "F64")
    input_error("safetensors file '{}': tensor '{}' has dtype {}, not a float type (F32, BF16, F16, F64)", path,
                info.name, info.dtype);
  if (checked_numel(info.shape) != numel)
    input_error("safetensors file '{}': tensor '{}' has {} elements, {} were expected", path, info.name,
                checked_numel(info.shape), numel);
}

}  // namespace

void SafetensorsFile::read_as_float(const SafetensorInfo& info, float* out, int64_t numel) const {
  check_float_read(path_, info, numel);
  decode(info.dtype, data(info), numel, out);
}

void SafetensorsFile::read_as_double(const SafetensorInfo& info, double* out, int64_t numel) const {
  check_float_read(path_, info, numel);
  decode(info.dtype, data(info), numel, out);
}

uint64_t write_safetensors(const std::string& path, const std::vector<SafetensorOut>& tensors,
                           const std::map<std::string, std::string>& metadata, uint64_t* checksum) {
  std::set<std::string> names;
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (auto it = metadata.begin(); it != metadata.end(); ++it) {
      if (it != metadata.begin()) header += ',';
      header += json_quote(it->first) + ':' + json_quote(it->second);
    }
    header += '}';
    first = false;
  }
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second)
      input_error("cannot write '{}': tensor name '{}' is empty, reserved or repeated", path, t.name);
    int64_t numel = checked_numel(t.shape);
    for (int64_t d : t.shape)
      if (d < 0) numel = -1;
    if (numel < 0) input_error("cannot write '{}': tensor '{}' has an invalid shape", path, t.name);
    const uint64_t nbytes = static_cast<uint64_t>(numel) * dtype_size(t.dtype);
    if (nbytes > 0 && t.data == nullptr) input_error("cannot write '{}': tensor '{}' has no data", path, t.name);
    if (!first) header += ',';
    first = false;
    header += json_quote(t.name) + ":{\"dtype\":\"" + st_dtype_name(t.dtype) + "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) header += (i ? "," : "") + std::to_string(t.shape[i]);
    header += "],\"data_offsets\":[" + std::to_string(offset) + ',' + std::to_string(offset + nbytes) + "]}";
    offset += nbytes;
    sizes.push_back(nbytes);
  }
  header += '}';
  header.append((8 - header.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp";
  DirectFileWriter file(tmp);  // past the page cache: see core/direct_file.h
  if (!file.ok()) input_error("cannot open '{}' for writing: {}", tmp, std::strerror(file.error()));
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((static_cast<uint64_t>(header.size()) >> (8 * i)) & 0xff);
  Checksum64 sum;
  auto put = [&](const void* p, size_t n) {
    if (checksum) sum.update(p, n);
    return file.write(p, n);
  };
  bool ok = put(len, 8) && put(header.data(), header.size());
  // The tensors are written in host byte order, which safetensors' little-endian matches on every supported CPU.
  for (size_t i = 0; ok && i < tensors.size(); ++i) ok = put(tensors[i].data, sizes[i]);
  ok = file.close() && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    // The first failure's errno: "No space left on device" says what to do, "failed" does not.
    throw std::runtime_error("writing '" + tmp + "' failed: " + std::strerror(file.error()));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error("renaming '" + tmp + "' to '" + path + "' failed");
  }
  if (checksum) *checksum = sum.value();
  return 8 + header.size() + offset;
}

}  // namespace mt
