// GPT-2's byte-level BPE tokenizer: text to token ids and back, from the files Hugging Face ships (tokenizer.json,
// or vocab.json with merges.txt beside it). Encoding splits the text as GPT-2's pre-tokenizer regex does
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// maps each piece's bytes to GPT-2's printable characters and applies the merges, lowest rank first. Added tokens
// (<|endoftext|>) are matched in the text before that. Decoding maps the tokens' characters back to bytes.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace mt {

class BpeTokenizer {
 public:
  // path: a tokenizer.json, a vocab.json (merges.txt in the same folder), or a folder holding either. A missing or
  // malformed file is an InputError naming it, and so is a tokenizer.json whose text pipeline is not GPT-2's (a
  // normalizer, another pre-tokenizer pattern, a prefix space), which would give other ids.
  static BpeTokenizer load(const std::string& path);

  std::vector<int32_t> encode(const std::string& text) const;
  // The bytes of the tokens (not necessarily valid UTF-8 when a character's bytes span a cut); an id outside the
  // vocabulary is an InputError.
  std::string decode(const std::vector<int32_t>& ids) const;
  int64_t vocab_size() const { return int64_t(tokens_.size()); }  // one more than the largest id

 private:
  void add_token(const std::string& token, int64_t id, const std::string& file);
  void add_merge(const std::string& left, const std::string& right, const std::string& file);
  void encode_piece(const std::string& piece, std::vector<int32_t>& out) const;

  std::unordered_map<std::string, int32_t> ids_;  // token (GPT-2's characters) -> id
  std::vector<std::string> tokens_;               // id -> token
  std::map<std::pair<std::string, std::string>, int> ranks_;  // merge -> its rank (earlier merges first)
  std::vector<std::string> added_;                // added tokens, matched whole in the text
};

}  // namespace mt
