// GPT-2's byte-level BPE tokenizer (see bpe_tokenizer.h).
#include "data/bpe_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.h"
#include "core/input_file.h"
#include "core/json.h"
#include "data/unicode_classes.h"

namespace mt {

namespace {

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += char(c);
  } else if (c < 0x800) {
    s += char(0xC0 | (c >> 6));
    s += char(0x80 | (c & 0x3F));
  } else {
    s += char(0xE0 | (c >> 12));
    s += char(0x80 | ((c >> 6) & 0x3F));
    s += char(0x80 | (c & 0x3F));
  }
  return s;
}

// GPT-2's bytes_to_unicode: each byte as a printable character, so that tokens never hold whitespace or control
// characters. The printable Latin-1 bytes stand for themselves, the other 68 for U+0100 onwards.
struct ByteMap {
  std::string to_char[256];                   // byte -> its character's UTF-8
  std::unordered_map<std::string, int> back;  // and back
  ByteMap() {
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = utf8(printable ? char32_t(b) : char32_t(256 + next++));
      back[to_char[b]] = b;
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// One code point of `s` at byte i: its value and byte length (an invalid byte counts as one code point of its own,
// outside every class).
char32_t next_code_point(const std::string& s, size_t i, size_t& len) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  len = 1;
  if (c < 0x80) return c;
  const int n = c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
  if (n == 0 || i + n > s.size()) return 0xFFFFFFFF;
  char32_t v = c & (0x3F >> (n - 1));
  for (int k = 1; k < n; ++k) {
    const unsigned char d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) return 0xFFFFFFFF;
    v = (v << 6) | (d & 0x3F);
  }
  len = n;
  return v;
}

bool is_space(char32_t c) {  // Unicode's White_Space, as the regex's \s
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

enum class Class { Letter, Number, Space, Other };
Class class_of(char32_t c) {
  if (c < 0x80) {
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return Class::Letter;
    if (c >= '0' && c <= '9') return Class::Number;
    return is_space(c) ? Class::Space : Class::Other;
  }
  if (c == 0xFFFFFFFF) return Class::Other;
  if (is_space(c)) return Class::Space;
  if (is_unicode_letter(c)) return Class::Letter;
  return is_unicode_number(c) ? Class::Number : Class::Other;
}

// The pieces of `text` (no added tokens in it) as GPT-2's pre-tokenizer regex cuts them.
std::vector<std::string> pre_tokenize(const std::string& text) {
  struct Cp {
    size_t at;
    Class cls;
  };
  std::vector<Cp> cps;
  for (size_t i = 0, len = 0; i < text.size(); i += len) cps.push_back({i, class_of(next_code_point(text, i, len))});
  const size_t n = cps.size();
  auto byte_at = [&](size_t k) { return k < n ? cps[k].at : text.size(); };
  auto run = [&](size_t k, Class c) {  // the end of the run of class c from k
    while (k < n && cps[k].cls == c) ++k;
    return k;
  };
  std::vector<std::string> pieces;
  for (size_t k = 0; k < n;) {
    size_t end = k;
    const char c = text[cps[k].at];
    // 's|'t|'re|'ve|'m|'ll|'d
    if (c == '\'' && k + 1 < n) {
      const std::string rest = text.substr(cps[k + 1].at, 2);
      if (rest[0] == 's' || rest[0] == 't' || rest[0] == 'm' || rest[0] == 'd') end = k + 2;
      else if (rest == "re" || rest == "ve" || rest == "ll") end = k + 3;
    }
    if (end == k) {
      // ' ?' then a run of letters, numbers or others: the space joins the run after it.
      const size_t s = c == ' ' && k + 1 < n && cps[k + 1].cls != Class::Space ? k + 1 : k;
      if (cps[s].cls != Class::Space) {
        end = run(s, cps[s].cls);
      } else {  // \s+(?!\S): the whitespace run, less its last character when a non-space follows; else \s+.
        const size_t e = run(k, Class::Space);
        end = e == n || e - k == 1 ? e : e - 1;
      }
    }
    pieces.push_back(text.substr(byte_at(k), byte_at(end) - byte_at(k)));
    k = end;
  }
  return pieces;
}

std::string read_whole(const std::string& path, const char* what) {
  require_regular_file(path, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) input_error("cannot open {} '{}'", what, path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Json parse_file(const std::string& path, const std::string& text) {
  try {
    return parse_json(text);
  } catch (const JsonError& e) {
    input_error("tokenizer file '{}' is not valid JSON: {}", path, e.what());
  }
}

// Only GPT-2's own text pipeline is implemented: no normalizer, and the ByteLevel pre-tokenizer with GPT-2's
// pattern and no prefix space. Another one (Llama 3's split pattern, RoBERTa's prefix space, a lowercasing
// normalizer) would give other ids without a word, so it is refused.
void check_gpt2_pipeline(const Json& j, const std::string& file) {
  const Json* norm = j.get("normalizer");
  if (norm && norm->type != Json::Type::Null)
    input_error("tokenizer file '{}' has a normalizer; only GPT-2's pipeline (none) is implemented", file);
  const Json* pre = j.get("pre_tokenizer");
  const Json* type = pre && pre->is_object() ? pre->get("type") : nullptr;
  auto flag = [&](const char* key, bool fallback) {
    const Json* v = pre->get(key);
    return v && v->type == Json::Type::Bool ? v->boolean : fallback;
  };
  if (!type || !type->is_string() || type->string != "ByteLevel" || flag("add_prefix_space", false) ||
      !flag("use_regex", true))
    input_error("tokenizer file '{}': its pre_tokenizer is not GPT-2's (ByteLevel, GPT-2's pattern, no prefix "
                "space); only that one is implemented", file);
}

}  // namespace

void BpeTokenizer::add_token(const std::string& token, int64_t id, const std::string& file) {
  if (id < 0 || id > (int64_t(1) << 30)) input_error("tokenizer file '{}': token '{}' has the id {}", file, token, id);
  if (!ids_.emplace(token, int32_t(id)).second) input_error("tokenizer file '{}': token '{}' twice", file, token);
  if (int64_t(tokens_.size()) <= id) tokens_.resize(size_t(id) + 1);
  if (!tokens_[size_t(id)].empty()) input_error("tokenizer file '{}': id {} given to two tokens", file, id);
  tokens_[size_t(id)] = token;
}

void BpeTokenizer::add_merge(const std::string& left, const std::string& right, const std::string& file) {
  if (left.empty() || right.empty()) input_error("tokenizer file '{}': merge {} is not two tokens", file, ranks_.size());
  ranks_.emplace(std::make_pair(left, right), int(ranks_.size()));
}

BpeTokenizer BpeTokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::string file = path;
  if (fs::is_directory(path))
    file = fs::exists(fs::path(path) / "tokenizer.json") ? (fs::path(path) / "tokenizer.json").string()
                                                         : (fs::path(path) / "vocab.json").string();
  BpeTokenizer t;
  const Json j = parse_file(file, read_whole(file, "tokenizer file"));
  if (!j.is_object()) input_error("tokenizer file '{}' is not a JSON object", file);
  const Json* vocab = &j;  // vocab.json is the vocabulary itself
  const Json* model = j.get("model");
  if (model) {  // tokenizer.json
    const Json* type = model->get("type");
    if (!type || !type->is_string() || type->string != "BPE")
      input_error("tokenizer file '{}': model.type is not \"BPE\" (only GPT-2's byte-level BPE is read)", file);
    vocab = model->get("vocab");
    if (!vocab || !vocab->is_object()) input_error("tokenizer file '{}' has no model.vocab object", file);
    check_gpt2_pipeline(j, file);
  }
  for (const auto& [token, id] : vocab->object) {
    if (!id.is_uint()) input_error("tokenizer file '{}': the id of '{}' is not a non-negative integer", file, token);
    t.add_token(token, int64_t(id.integer), file);
  }
  if (model) {
    const Json* merges = model->get("merges");
    if (!merges || !merges->is_array()) input_error("tokenizer file '{}' has no model.merges array", file);
    for (const Json& m : merges->array) {
      if (m.is_string()) {  // "left right"
        const size_t sp = m.string.find(' ');
        if (sp == std::string::npos) input_error("tokenizer file '{}': merge '{}' is not two tokens", file, m.string);
        t.add_merge(m.string.substr(0, sp), m.string.substr(sp + 1), file);
      } else if (m.is_array() && m.array.size() == 2 && m.array[0].is_string() && m.array[1].is_string()) {
        t.add_merge(m.array[0].string, m.array[1].string, file);
      } else {
        input_error("tokenizer file '{}': a merge is neither \"left right\" nor [left, right]", file);
      }
    }
    if (const Json* added = j.get("added_tokens"); added && added->is_array())
      for (const Json& a : added->array) {
        const Json* content = a.get("content");
        const Json* id = a.get("id");
        if (!content || !content->is_string() || content->string.empty() || !id || !id->is_uint())
          input_error("tokenizer file '{}': an added token without content and id", file);
        if (!t.ids_.count(content->string)) t.add_token(content->string, int64_t(id->integer), file);
        t.added_.push_back(content->string);
      }
  } else {
    // GPT-2's vocab.json: its one special token, which the text may hold whole.
    if (t.ids_.count("<|endoftext|>")) t.added_.push_back("<|endoftext|>");
    const std::string merges_file = (fs::path(file).parent_path() / "merges.txt").string();
    std::istringstream in(read_whole(merges_file, "merges file"));
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || line.rfind("#version", 0) == 0) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string::npos) input_error("merges file '{}': '{}' is not two tokens", merges_file, line);
      t.add_merge(line.substr(0, sp), line.substr(sp + 1), merges_file);
    }
  }
  for (size_t id = 0; id < t.tokens_.size(); ++id)
    if (t.tokens_[id].empty()) input_error("tokenizer file '{}': no token has the id {}", file, id);
  for (int b = 0; b < 256; ++b)
    if (!t.ids_.count(byte_map().to_char[b]))
      input_error("tokenizer file '{}' is not byte-level: no token for the byte {} ('{}')", file, b,
                  byte_map().to_char[b]);
  // Longer added tokens first, so that one containing another wins.
  std::sort(t.added_.begin(), t.added_.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  return t;
}

void BpeTokenizer::encode_piece(const std::string& piece, std::vector<int32_t>& out) const {
  std::vector<std::string> parts;
  for (unsigned char b : piece) parts.push_back(byte_map().to_char[b]);
  // Merge the adjacent pair of lowest rank (its leftmost occurrence) until no pair is a merge.
  while (parts.size() > 1) {
    int best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto r = ranks_.find({parts[i], parts[i + 1]});
      if (r != ranks_.end() && (best < 0 || r->second < best)) best = r->second, at = i;
    }
    if (best < 0) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + long(at) + 1);
  }
  for (const std::string& p : parts) {
    const auto id = ids_.find(p);
    if (id == ids_.end()) input_error("the tokenizer's merges make '{}', which its vocabulary lacks", p);
    out.push_back(id->second);
  }
}

std::vector<int32_t> BpeTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> out;
  size_t start = 0;
  auto plain = [&](size_t end) {
    for (const std::string& piece : pre_tokenize(text.substr(start, end - start))) encode_piece(piece, out);
  };
  for (size_t i = 0; i < text.size();) {
    const std::string* hit = nullptr;
    for (const std::string& a : added_)
      if (text.compare(i, a.size(), a) == 0) {
        hit = &a;
        break;
      }
    if (!hit) {
      ++i;
      continue;
    }
    plain(i);
    out.push_back(ids_.at(*hit));
    i += hit->size();
    start = i;
  }
  plain(text.size());
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= int32_t(tokens_.size())) input_error("token id {} is outside the tokenizer's {} tokens", id,
                                                             tokens_.size());
    const std::string& token = tokens_[size_t(id)];
    if (std::find(added_.begin(), added_.end(), token) != added_.end()) {
      out += token;
      continue;
    }
    for (size_t i = 0, len = 0; i < token.size(); i += len) {
      next_code_point(token, i, len);
      const auto b = byte_map().back.find(token.substr(i, len));
      out += b != byte_map().back.end() ? std::string(1, char(b->second)) : token.substr(i, len);
    }
  }
  return out;
}

}  // namespace mt
