// Token file loaders (nanoGPT raw uint16, llm.c shards, byte-level text) and writers for tests and tools.
// Every refusal is an InputError naming the file; ids are checked against the vocabulary before training.
#include "data/tokens.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/errors.h"
#include "core/input_file.h"

namespace mt {

namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;
constexpr size_t kLlmcHeaderInts = 256;
constexpr size_t kLlmcHeaderBytes = kLlmcHeaderInts * 4;

std::vector<unsigned char> read_whole_file(const std::string& path, const char* what) {
  require_regular_file(path, what);
  std::ifstream f(path, std::ios::binary);
  if (!f) input_error("{} '{}': cannot open the file (missing or unreadable)", what, path);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) input_error("{} '{}': read error", what, path);
  return bytes;
}

int32_t le_i32(const unsigned char* p) {
  uint32_t u = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
               (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
  int32_t v;
  std::memcpy(&v, &u, 4);
  return v;
}

void decode_uint16(const std::string& path, const unsigned char* p, size_t count, int vocab_size, size_t pos0,
                   std::vector<int32_t>& out) {
  out.resize(count);
  for (size_t i = 0; i < count; ++i) {
    int32_t id = static_cast<int32_t>(p[2 * i]) | (static_cast<int32_t>(p[2 * i + 1]) << 8);
    if (id >= vocab_size)
      input_error("token file '{}': token id {} at position {} (byte offset {}) is out of range for "
                  "vocab_size {}",
                  path, id, i, pos0 + 2 * i, vocab_size);
    out[i] = id;
  }
}

// Header words 3..255 of an llm.c shard are zero; raw token data essentially never has 253 zero words there.
bool looks_like_llmc_header(const unsigned char* p) {
  for (size_t w = 3; w < kLlmcHeaderBytes / 4; ++w)
    if (le_i32(p + 4 * w) != 0) return false;
  return true;
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) input_error("cannot open '{}' for writing", path);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) throw std::runtime_error("write to '" + path + "' failed");
}

void put_u16(std::vector<unsigned char>& out, const std::string& path, size_t i, int32_t t) {
  if (t < 0 || t > 65535) input_error("cannot write token {} at position {} to '{}': not a uint16", t, i, path);
  out.push_back(static_cast<unsigned char>(t & 0xff));
  out.push_back(static_cast<unsigned char>((t >> 8) & 0xff));
}

}  // namespace

TokenStream load_token_file(const std::string& path, int vocab_size) {
  if (vocab_size <= 0) input_error("token file '{}': vocab_size must be positive, got {}", path, vocab_size);
  std::vector<unsigned char> bytes = read_whole_file(path, "token file");
  if (bytes.empty()) input_error("token file '{}' is empty", path);
  TokenStream ts;
  if (bytes.size() >= 4 && le_i32(bytes.data()) == kLlmcMagic) {
    if (bytes.size() < kLlmcHeaderBytes)
      input_error("llm.c shard '{}': the file has {} bytes, shorter than the {}-byte header", path, bytes.size(),
                  kLlmcHeaderBytes);
    int32_t version = le_i32(bytes.data() + 4);
    if (version != kLlmcVersion)
      input_error("llm.c shard '{}': header version {} is not supported (expected {})", path, version,
                  kLlmcVersion);
    int32_t count = le_i32(bytes.data() + 8);
    size_t payload = bytes.size() - kLlmcHeaderBytes;
    if (count < 0) input_error("llm.c shard '{}': negative token count {} in the header", path, count);
    if (payload != 2 * static_cast<size_t>(count))
      input_error("llm.c shard '{}': the header says {} tokens ({} bytes) but the file holds {} bytes after the "
                  "header ({})",
                  path, count, 2 * static_cast<size_t>(count), payload,
                  payload < 2 * static_cast<size_t>(count) ? "truncated" : "trailing bytes");
    if (count == 0) input_error("llm.c shard '{}' holds no tokens", path);
    decode_uint16(path, bytes.data() + kLlmcHeaderBytes, static_cast<size_t>(count), vocab_size,
                  kLlmcHeaderBytes, ts.tokens);
    ts.description = "llm.c shard " + path + ": " + std::to_string(count) + " tokens";
  } else {
    // A file laid out like an llm.c shard (a 1024-byte header whose unused words are zero) but without the
    // magic number is a corrupt or foreign shard, not raw tokens: say so rather than report odd token ids.
    if (bytes.size() >= kLlmcHeaderBytes && looks_like_llmc_header(bytes.data()))
      input_error("token file '{}': the layout is an llm.c shard's but the magic number is {} (expected {})",
                  path, le_i32(bytes.data()), kLlmcMagic);
    if (bytes.size() % 2 != 0)
      input_error("token file '{}': raw uint16 token file of odd length {} bytes (truncated?)", path,
                  bytes.size());
    decode_uint16(path, bytes.data(), bytes.size() / 2, vocab_size, 0, ts.tokens);
    ts.description = "raw uint16 tokens " + path + ": " + std::to_string(ts.tokens.size()) + " tokens";
  }
  return ts;
}

TokenStream load_text_file(const std::string& path, int vocab_size) {
  if (vocab_size < 256)
    input_error("text file '{}': byte-level text needs vocab_size >= 256, got {}", path, vocab_size);
  std::vector<unsigned char> bytes = read_whole_file(path, "text file");
  if (bytes.empty()) input_error("text file '{}' is empty", path);
  TokenStream ts;
  ts.tokens.assign(bytes.begin(), bytes.end());
  ts.description = "byte-level text " + path + ": " + std::to_string(ts.tokens.size()) + " tokens";
  return ts;
}

void write_llmc_shard(const std::string& path, const std::vector<int32_t>& tokens) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX))
    input_error("cannot write '{}': {} tokens do not fit an llm.c shard", path, tokens.size());
  std::vector<unsigned char> out;
  out.reserve(kLlmcHeaderBytes + 2 * tokens.size());
  int32_t header[kLlmcHeaderInts] = {};
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  for (int32_t h : header) {
    uint32_t u = static_cast<uint32_t>(h);
    for (int b = 0; b < 4; ++b) out.push_back(static_cast<unsigned char>((u >> (8 * b)) & 0xff));
  }
  for (size_t i = 0; i < tokens.size(); ++i) put_u16(out, path, i, tokens[i]);
  write_bytes(path, out);
}

void write_raw_uint16(const std::string& path, const std::vector<int32_t>& tokens) {
  std::vector<unsigned char> out;
  out.reserve(2 * tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) put_u16(out, path, i, tokens[i]);
  write_bytes(path, out);
}

}  // namespace mt
