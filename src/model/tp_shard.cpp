// Assembling full tensors from tensor-parallel shards and cutting shards out of full tensors, run by run (each
// run is contiguous both in the shard and in the global tensor).
#include "model/tp_shard.h"

#include <algorithm>
#include <cstring>

#include "model/safetensors.h"

namespace mt {

void assemble_full_param(const ParamSpec& spec, const std::vector<const float*>& flat_by_rank, float* full) {
  const int64_t n_full = spec.full_numel();
  if (spec.shard.whole()) {
    CHECK(!flat_by_rank.empty(), "{}: no shards to assemble", spec.name);
    std::memcpy(full, flat_by_rank[0] + spec.offset, sizeof(float) * n_full);  // padding is a suffix
    return;
  }
  const int copies = spec.shard.copies;
  CHECK(static_cast<int>(flat_by_rank.size()) == spec.shard.parts * copies, "{}: {} shards given for tp = {}",
        spec.name, flat_by_rank.size(), spec.shard.parts * copies);
  const int64_t len = spec.run_length();
  for (int r = 0; r < spec.shard.parts; ++r) {
    const ParamSpec s = spec.for_part(r);
    const float* local = flat_by_rank[r * copies] + s.offset;  // the first copy of part r
    for (int64_t q = 0; q < s.num_runs(); ++q) {
      const int64_t g0 = s.run_global_begin(q);
      const int64_t n = std::min(len, n_full - g0);  // drop vocabulary padding
      if (n > 0) std::memcpy(full + g0, local + q * len, sizeof(float) * n);
    }
  }
}

std::vector<std::vector<float>> assemble_full(const ParamTable& layout, const std::vector<const float*>& flat_by_rank) {
  std::vector<std::vector<float>> out(layout.size());
  for (int p = 0; p < layout.size(); ++p) {
    out[p].resize(layout[p].full_numel());
    assemble_full_param(layout[p], flat_by_rank, out[p].data());
  }
  return out;
}

void extract_shard(const ParamSpec& spec, const float* full, float* local) {
  const int64_t len = spec.run_length(), n_full = spec.full_numel();
  for (int64_t q = 0; q < spec.num_runs(); ++q) {
    const int64_t g0 = spec.run_global_begin(q);
    const int64_t n = std::max<int64_t>(0, std::min(len, n_full - g0));
    if (n > 0) std::memcpy(local + q * len, full + g0, sizeof(float) * n);
    std::fill(local + q * len + n, local + (q + 1) * len, 0.0f);
  }
}

void write_full_safetensors(const std::string& path, const ParamTable& layout,
                            const std::vector<std::vector<float>>& full) {
  CHECK(static_cast<int>(full.size()) == layout.size(), "{} full tensors for {} parameters", full.size(),
        layout.size());
  std::vector<SafetensorOut> out;
  for (int p = 0; p < layout.size(); ++p) {
    const ParamSpec& s = layout[p];
    CHECK(static_cast<int64_t>(full[p].size()) == s.full_numel(), "{}: {} elements, expected {}", s.name,
          full[p].size(), s.full_numel());
    std::vector<int64_t> shape(s.full_shape.d.begin(), s.full_shape.d.begin() + s.full_shape.n);
    out.push_back({s.name, DType::F32, shape, full[p].data()});
  }
  write_safetensors(path, out, {{"format", "pt"}});
}

}  // namespace mt
