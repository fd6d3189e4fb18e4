// Token streams: loading the formats of docs/data.md into memory, with every id checked against the
// vocabulary. All loaders throw InputError naming the file and the problem (exit status 2).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mt {

struct TokenStream {
  std::vector<int32_t> tokens;
  std::string description;  // for the log, e.g. "llm.c shard data/x.bin: 1048576 tokens"
};

// Raw little-endian uint16 tokens (nanoGPT .bin) or an llm.c shard (256 x int32 header: magic 20240520,
// version 1, token count; then uint16 tokens), told apart by the magic number. Refuses: a missing file, an
// llm.c header with a wrong version or a token count that disagrees with the file length, a raw file of odd
// length, and token ids >= vocab_size.
TokenStream load_token_file(const std::string& path, int vocab_size);

// UTF-8 text read as bytes (vocabulary 256). vocab_size must be >= 256.
TokenStream load_text_file(const std::string& path, int vocab_size);

// Writes tokens as an llm.c shard (used by tests and tools).
void write_llmc_shard(const std::string& path, const std::vector<int32_t>& tokens);
// Writes tokens as raw little-endian uint16.
void write_raw_uint16(const std::string& path, const std::vector<int32_t>& tokens);

}  // namespace mt
