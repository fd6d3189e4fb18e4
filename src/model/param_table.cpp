// Parameter table bookkeeping: offsets are 16-element aligned so every parameter starts on a 64-byte line.
#include "model/param_table.h"

namespace mt {

int ParamTable::add(const std::string& name, Shape shape, Shape full_shape, bool decay) {
  CHECK(index_of(name) < 0, "parameter {} added twice", name);
  ParamSpec s;
  s.name = name;
  s.shape = shape;
  s.full_shape = full_shape;
  s.decay = decay;
  s.offset = (total_ + 15) / 16 * 16;
  total_ = s.offset + shape.numel();
  specs_.push_back(s);
  return size() - 1;
}

int ParamTable::index_of(const std::string& name) const {
  for (int i = 0; i < size(); ++i)
    if (specs_[i].name == name) return i;
  return -1;
}

}  // namespace mt
