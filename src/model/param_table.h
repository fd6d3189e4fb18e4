// The parameter table: every parameter's global name (GPT-2 Hugging Face names), full shape, whether weight
// decay applies, and its offset in this rank's flat parameter and gradient buffers. Offsets follow the order
// parameters are added; the GPT adds them in reverse order of use, so gradients that finish first during the
// backward pass sit first in the gradient buffer (and will form the first data-parallel bucket).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mt {

struct ParamSpec {
  std::string name;
  Shape shape;        // as stored here (the token embedding's rows are padded to the padded vocabulary)
  Shape full_shape;   // as exported (unpadded)
  bool decay = false;  // AdamW weight decay: matrices and embeddings only
  int64_t offset = 0;  // in elements, into the flat buffers
  int64_t numel() const { return shape.numel(); }
};

class ParamTable {
 public:
  // Adds a parameter at the end of the flat buffers and returns its index.
  int add(const std::string& name, Shape shape, Shape full_shape, bool decay);
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const ParamSpec& operator[](int i) const { return specs_[i]; }
  int size() const { return static_cast<int>(specs_.size()); }
  int64_t total_numel() const { return total_; }
  int index_of(const std::string& name) const;  // -1 when absent

 private:
  std::vector<ParamSpec> specs_;
  int64_t total_ = 0;
};

}  // namespace mt
