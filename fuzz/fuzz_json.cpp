// Fuzzes the strict JSON parser (core/json.h), which reads safetensors headers and checkpoint metadata.
// Allowed outcomes: a Json value or JsonError. Properties checked on success: the value is no deeper than the
// cap, strings are valid UTF-8 (json_quote of one parses back to the same string), and object keys are unique.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/json.h"
#include "fuzz_util.h"

namespace {

using mt::Json;

void check_utf8_roundtrip(const std::string& s) {
  Json back;
  try {
    back = mt::parse_json(mt::json_quote(s));
  } catch (const mt::JsonError& e) {
    mt::fuzz::property_failed(std::string("json_quote of a parsed string does not parse: ") + e.what());
  }
  if (!back.is_string() || back.string != s) mt::fuzz::property_failed("json_quote round trip changed a string");
}

int depth_of(const Json& v) {
  int d = 0;
  for (const Json& e : v.array) d = std::max(d, 1 + depth_of(e));
  for (const auto& kv : v.object) d = std::max(d, 1 + depth_of(kv.second));
  return d;
}

void walk(const Json& v) {
  (void)v.type_name();
  if (v.is_string()) check_utf8_roundtrip(v.string);
  if (v.is_uint() && v.integer <= static_cast<uint64_t>(INT64_MAX) &&
      v.signed_integer != static_cast<int64_t>(v.integer))
    mt::fuzz::property_failed("integer and signed_integer disagree");
  for (const Json& e : v.array) walk(e);
  for (size_t i = 0; i < v.object.size(); ++i) {
    check_utf8_roundtrip(v.object[i].first);
    if (v.get(v.object[i].first) != &v.object[i].second) mt::fuzz::property_failed("duplicate object key");
    walk(v.object[i].second);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  for (int max_depth : {64, 3}) {
    try {
      Json v = mt::parse_json(text, max_depth);
      if (depth_of(v) > max_depth) mt::fuzz::property_failed("value nested deeper than max_depth");
      walk(v);
    } catch (const mt::JsonError&) {
    }
  }
  return 0;
}
