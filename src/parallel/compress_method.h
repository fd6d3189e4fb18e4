// The method of the data-parallel gradient reduction (comm.compress; docs/compression.md). Apart from
// grad_compress.h so that train/config.h can hold one without the communicator headers.
#pragma once
#include <cstdint>

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

}  // namespace mt
