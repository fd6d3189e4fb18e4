// A small strict JSON (RFC 8259) parser for headers of binary formats (safetensors) and small config-like files.
// Strict: no comments, no trailing commas, no NaN/Infinity, no duplicate object keys, no control characters in
// strings, valid UTF-8 only, nesting depth capped (so hostile input cannot overflow the stack). Errors throw
// JsonError with the byte offset; callers turn them into InputError naming their file.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mt {

struct JsonError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Json {
  enum class Type : uint8_t { Null, Bool, Number, String, Array, Object };
  Type type = Type::Null;
  bool boolean = false;
  double number = 0;         // every number, as a double
  bool is_integer = false;   // written without fraction or exponent and fits int64 or uint64
  bool is_negative = false;  // for integers: the sign (then `integer` holds the value as int64)
  uint64_t integer = 0;      // for non-negative integers: the exact value (up to 2^64 - 1)
  int64_t signed_integer = 0;  // for integers that fit int64: the exact value
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;  // in file order; keys are unique

  bool is_object() const { return type == Type::Object; }
  bool is_array() const { return type == Type::Array; }
  bool is_string() const { return type == Type::String; }
  bool is_number() const { return type == Type::Number; }
  // A non-negative integer (exact, up to 2^64 - 1).
  bool is_uint() const { return type == Type::Number && is_integer && !is_negative; }
  const Json* get(std::string_view key) const;  // object member or nullptr
  const char* type_name() const;
};

// Parses exactly one JSON value; surrounding whitespace is allowed, anything else after it is an error.
Json parse_json(std::string_view text, int max_depth = 64);

// `s` as a JSON string literal (quotes included), escaping what RFC 8259 requires.
std::string json_quote(std::string_view s);

}  // namespace mt
