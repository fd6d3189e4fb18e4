// model.arch: the transformer block family (model/gpt.h runs both).
#pragma once
#include <cstdint>

#include "core/enum_names.h"

namespace mt {

enum class ModelArch : uint8_t { GPT2, Llama };
inline const auto& enum_names(ModelArch) {
  static constexpr EnumName<ModelArch> names[] = {{ModelArch::GPT2, "gpt2"}, {ModelArch::Llama, "llama"}};
  return names;
}

// Llama's SwiGLU hidden size: ffn_hidden when given (> 0), else 2/3 of 4 d_model rounded up to multiple_of.
inline int llama_mlp_hidden(int d_model, int ffn_hidden, int multiple_of) {
  if (ffn_hidden > 0) return ffn_hidden;
  const int h = 2 * (4 * d_model) / 3;
  return (h + multiple_of - 1) / multiple_of * multiple_of;
}

}  // namespace mt
