// The strict JSON parser of json.h: a recursive-descent parser over a string_view with a depth cap.
#include "core/json.h"

#include <cerrno>
#include <cstdlib>
#include <fmt/format.h>

namespace mt {

const Json* Json::get(std::string_view key) const {
  if (type != Type::Object) return nullptr;
  for (const auto& kv : object)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

const char* Json::type_name() const {
  switch (type) {
    case Type::Null: return "null";
    case Type::Bool: return "a boolean";
    case Type::Number: return "a number";
    case Type::String: return "a string";
    case Type::Array: return "an array";
    case Type::Object: return "an object";
  }
  return "?";
}

namespace {

class Parser {
 public:
  Parser(std::string_view s, int max_depth) : s_(s), max_depth_(max_depth) {}

  Json parse_document() {
    skip_ws();
    Json v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected characters after the JSON value");
    return v;
  }

 private:
  std::string_view s_;
  size_t pos_ = 0;
  int max_depth_;

  [[noreturn]] void fail(const std::string& what) const {
    throw JsonError(fmt::format("invalid JSON at byte {}: {}", pos_, what));
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }
  void skip_ws() {
    while (!at_end() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  void expect_literal(std::string_view lit) {
    if (s_.substr(pos_, lit.size()) != lit) fail("unknown literal");
    pos_ += lit.size();
  }

  Json parse_value(int depth) {
    if (depth > max_depth_) fail(fmt::format("nesting deeper than {}", max_depth_));
    if (at_end()) fail("unexpected end of input");
    Json v;
    char c = peek();
    if (c == '{') {
      v.type = Json::Type::Object;
      ++pos_;
      skip_ws();
      if (peek() == '}') { ++pos_; return v; }
      for (;;) {
        skip_ws();
        if (peek() != '"') fail("expected a string key");
        std::string key = parse_string();
        for (const auto& kv : v.object)
          if (kv.first == key) fail(fmt::format("duplicate key \"{}\"", key));
        skip_ws();
        if (peek() != ':') fail("expected ':'");
        ++pos_;
        skip_ws();
        Json member = parse_value(depth + 1);
        v.object.emplace_back(std::move(key), std::move(member));
        skip_ws();
        if (peek() == ',') { ++pos_; continue; }
        if (peek() == '}') { ++pos_; return v; }
        fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.type = Json::Type::Array;
      ++pos_;
      skip_ws();
      if (peek() == ']') { ++pos_; return v; }
      for (;;) {
        skip_ws();
        v.array.push_back(parse_value(depth + 1));
        skip_ws();
        if (peek() == ',') { ++pos_; continue; }
        if (peek() == ']') { ++pos_; return v; }
        fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.type = Json::Type::String;
      v.string = parse_string();
      return v;
    }
    if (c == 't') { expect_literal("true"); v.type = Json::Type::Bool; v.boolean = true; return v; }
    if (c == 'f') { expect_literal("false"); v.type = Json::Type::Bool; return v; }
    if (c == 'n') { expect_literal("null"); return v; }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
    fail(fmt::format("unexpected character '{}'", c));
  }

  Json parse_number() {
    size_t start = pos_;
    bool neg = false, integral = true;
    if (peek() == '-') { neg = true; ++pos_; }
    if (peek() == '0') {
      ++pos_;
    } else if (peek() >= '1' && peek() <= '9') {
      while (peek() >= '0' && peek() <= '9') ++pos_;
    } else {
      fail("malformed number");
    }
    size_t int_end = pos_;
    if (peek() == '.') {
      integral = false;
      ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("malformed number");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      integral = false;
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("malformed number");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    Json v;
    v.type = Json::Type::Number;
    std::string text(s_.substr(start, pos_ - start));
    v.number = std::strtod(text.c_str(), nullptr);
    if (integral) {
      // Exact integer value, digit by digit, refusing overflow of uint64 (or of int64 for negatives).
      uint64_t mag = 0;
      bool overflow = false;
      for (size_t i = start + (neg ? 1 : 0); i < int_end; ++i) {
        uint64_t d = static_cast<uint64_t>(s_[i] - '0');
        if (mag > (UINT64_MAX - d) / 10) { overflow = true; break; }
        mag = mag * 10 + d;
      }
      if (!overflow) {
        if (!neg) {
          v.is_integer = true;
          v.integer = mag;
          if (mag <= static_cast<uint64_t>(INT64_MAX)) v.signed_integer = static_cast<int64_t>(mag);
        } else if (mag <= static_cast<uint64_t>(INT64_MAX) + 1) {
          v.is_integer = true;
          v.is_negative = mag != 0;
          v.signed_integer = static_cast<int64_t>(0 - mag);
        }
      }
    }
    return v;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  uint32_t parse_hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
      else fail("bad hex digit in \\u escape");
    }
    return v;
  }

  // Copies one UTF-8 encoded code point starting at pos_, refusing malformed, overlong and surrogate forms.
  void copy_utf8(std::string& out) {
    auto b = [&](size_t i) { return static_cast<unsigned char>(s_[i]); };
    unsigned char c0 = b(pos_);
    int len;
    uint32_t cp;
    if (c0 < 0x80) { out += static_cast<char>(c0); ++pos_; return; }
    if ((c0 & 0xE0) == 0xC0) { len = 2; cp = c0 & 0x1F; }
    else if ((c0 & 0xF0) == 0xE0) { len = 3; cp = c0 & 0x0F; }
    else if ((c0 & 0xF8) == 0xF0) { len = 4; cp = c0 & 0x07; }
    else fail("invalid UTF-8");
    if (pos_ + static_cast<size_t>(len) > s_.size()) fail("truncated UTF-8 sequence");
    for (int i = 1; i < len; ++i) {
      unsigned char ci = b(pos_ + static_cast<size_t>(i));
      if ((ci & 0xC0) != 0x80) fail("invalid UTF-8");
      cp = (cp << 6) | (ci & 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail("invalid UTF-8");
    out.append(s_.data() + pos_, static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      char c = s_[pos_];
      if (c == '"') { ++pos_; return out; }
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') { copy_utf8(out); continue; }
      ++pos_;
      if (at_end()) fail("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = parse_hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.substr(pos_, 2) != "\\u") fail("unpaired surrogate in \\u escape");
            pos_ += 2;
            uint32_t lo = parse_hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("unpaired surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("unpaired surrogate in \\u escape");
          }
          append_utf8(out, cp);
          break;
        }
        default: fail(fmt::format("bad escape '\\{}'", e));
      }
    }
  }
};

}  // namespace

Json parse_json(std::string_view text, int max_depth) { return Parser(text, max_depth).parse_document(); }

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (u < 0x20) out += fmt::format("\\u{:04x}", u);
    else out += c;
  }
  out += '"';
  return out;
}

}  // namespace mt
