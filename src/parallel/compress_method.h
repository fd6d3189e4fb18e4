// The method of the data-parallel gradient reduction (comm.compress; docs/compression.md). Apart from
// grad_compress.h so that train/config.h can hold one without the communicator headers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/enum_names.h"

namespace mt {

// None and BF16 are the plain all-reduce (BF16: wire dtype bf16); Int8, TopK and PowerSGD are the compressors of
// grad_compress.h, with error feedback.
enum class CompressMethod : uint8_t { None, BF16, Int8, TopK, PowerSGD };

inline const auto& enum_names(CompressMethod) {
  static constexpr EnumName<CompressMethod> names[] = {{CompressMethod::None, "none"},
                                                       {CompressMethod::BF16, "bf16"},
                                                       {CompressMethod::Int8, "int8"},
                                                       {CompressMethod::TopK, "topk"},
                                                       {CompressMethod::PowerSGD, "powersgd"}};
  return names;
}

// "none, bf16, powersgd" -> the methods in that order; false (with `bad` set to the offending name) when a name is
// not a method. An empty or blank text is an empty list.
inline bool parse_compress_list(const std::string& text, std::vector<CompressMethod>& out, std::string& bad) {
  out.clear();
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string name = text.substr(i, j - i);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    CompressMethod m;
    if (!name.empty() || j < text.size()) {
      if (!parse_name(name, m)) return bad = name, false;
      out.push_back(m);
    }
    i = j + 1;
  }
  return true;
}

}  // namespace mt
