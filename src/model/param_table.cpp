// Parameter table bookkeeping: offsets are 16-element aligned so every parameter starts on a 64-byte line; the
// tensor-parallel shard arithmetic (see the layout table in param_table.h).
#include "model/param_table.h"

namespace mt {

namespace {

// The global shape viewed as [outer, D, inner] around the split dimension.
struct SplitView {
  int64_t outer = 1, D = 1, inner = 1;
};

SplitView split_view(const Shape& global, int dim) {
  SplitView v;
  for (int i = 0; i < dim; ++i) v.outer *= global[i];
  v.D = global[dim];
  for (int i = dim + 1; i < global.n; ++i) v.inner *= global[i];
  return v;
}

}  // namespace

int64_t ParamSpec::run_length() const {
  if (shard.whole()) return numel();
  const SplitView v = split_view(global_shape, shard.dim);
  return v.D / (int64_t(shard.groups) * shard.parts) * v.inner;
}

int64_t ParamSpec::num_runs() const {
  if (shard.whole()) return 1;
  return split_view(global_shape, shard.dim).outer * shard.groups;
}

int64_t ParamSpec::run_global_begin(int64_t run) const {
  if (shard.whole()) return 0;
  const SplitView v = split_view(global_shape, shard.dim);
  const int64_t chunk = v.D / (int64_t(shard.groups) * shard.parts);
  const int64_t o = run / shard.groups, group = run % shard.groups;
  return (o * v.D + group * (v.D / shard.groups) + int64_t(shard.part) * chunk) * v.inner;
}

int64_t ParamSpec::global_index(int64_t local) const {
  if (shard.whole()) return local;
  const int64_t len = run_length();
  return run_global_begin(local / len) + local % len;
}

ParamSpec ParamSpec::for_part(int part) const {
  CHECK(part >= 0 && part < shard.parts, "{}: tp part {} out of range [0, {})", name, part, shard.parts);
  ParamSpec s = *this;
  s.shard.part = part;
  return s;
}

int ParamTable::add(const std::string& name, Shape global_shape, Shape full_shape, bool decay, Shard shard) {
  CHECK(index_of(name) < 0, "parameter {} added twice", name);
  CHECK(shard.parts >= 1 && shard.part >= 0 && shard.part < shard.parts && shard.groups >= 1,
        "{}: bad shard (part {} of {}, {} groups)", name, shard.part, shard.parts, shard.groups);
  CHECK(shard.dim < global_shape.n, "{}: split dim {} of a {}-d tensor", name, shard.dim, global_shape.n);
  // Padding adds rows only: the trailing dims agree, so the global tensor's prefix is the full tensor.
  bool pad_ok = full_shape.n == global_shape.n && (global_shape.n == 0 || full_shape[0] <= global_shape[0]);
  for (int i = 1; pad_ok && i < global_shape.n; ++i) pad_ok = full_shape[i] == global_shape[i];
  CHECK(pad_ok, "{}: full shape {} is not a row prefix of the global shape {}", name, full_shape.str(),
        global_shape.str());
  Shape local = global_shape;
  if (shard.dim >= 0) {
    const int64_t cut = int64_t(shard.groups) * shard.parts;
    CHECK(global_shape[shard.dim] % cut == 0, "{}: dim {} of {} does not split into {} groups x {} parts", name,
          shard.dim, global_shape.str(), shard.groups, shard.parts);
    local.d[shard.dim] = global_shape[shard.dim] / shard.parts;
  }
  ParamSpec s;
  s.name = name;
  s.shape = local;
  s.global_shape = global_shape;
  s.full_shape = full_shape;
  s.shard = shard;
  s.decay = decay;
  s.offset = (total_ + 15) / 16 * 16;
  total_ = s.offset + local.numel();
  specs_.push_back(s);
  return size() - 1;
}

int ParamTable::index_of(const std::string& name) const {
  for (int i = 0; i < size(); ++i)
    if (specs_[i].name == name) return i;
  return -1;
}

}  // namespace mt
