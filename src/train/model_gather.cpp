// Gathering the full model from its shards (see model_gather.h).
#include "train/model_gather.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "model/tp_shard.h"

namespace mt {

namespace {

constexpr int kGatherTag = 30000;  // apart from the pipeline's activation and gradient tags

int64_t full_numel(const ParamTable& t) {
  int64_t n = 0;
  for (const ParamSpec& s : t.specs()) n += s.full_numel();
  return n;
}

// Copies of a parameter that training keeps equal: the tied wte's two (stage 0's embedding, the last stage's head)
// and a replicated parameter's on every tp rank, each updated apart from the same gradient. Any difference is a bug
// (the drift of gradient compression's per-bucket encodings was one). A rank's CHECK here ends the whole run (the
// trainer aborts every rank), so nothing waits for rank 0.
void check_copies_equal(const std::string& name, const float* first, const float* other, size_t n,
                        const std::string& where) {
  if (std::memcmp(first, other, n * sizeof(float)) == 0) return;
  int64_t differ = 0;
  double most = 0;
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(&first[i], &other[i], sizeof(float)) != 0)
      ++differ, most = std::max(most, std::fabs(double(first[i]) - double(other[i])));
  CHECK(false, "gathering the model: the copies of {} {} differ in {} of {} elements (by up to {:.3e}): copies that "
        "training keeps equal drifted apart", name, where, differ, n, most);
}

}  // namespace

void write_gathered_safetensors(const std::string& path, const PipelineChunks& model, const Tensor& flat,
                                const DeviceMesh& mesh, MeshComms& comms, const GPTConfig& base,
                                const std::vector<int>& layers_per_stage) {
  if (mesh.replica_rank() != 0) return;
  const ParamTable& table = model.table();
  // 1. This stage's full tensors on tp rank 0: every tp rank's flat buffer (equal sizes), assembled.
  std::vector<std::vector<float>> full;
  if (mesh.tp() == 1) {
    full = assemble_full(table, {flat.data_as<float>()});
  } else {
    const int64_t n = flat.numel();
    Tensor all = Tensor::zeros({n * mesh.tp()}, DType::F32);
    comms.tp->all_gather(flat, all);
    if (mesh.tp_rank() != 0) return;
    std::vector<const float*> by_rank;
    for (int r = 0; r < mesh.tp(); ++r) by_rank.push_back(all.data_as<float>() + r * n);
    for (const ParamSpec& s : table.specs())  // copies several tp ranks hold: against the first rank's of each
      for (int r = 1; r < mesh.tp(); ++r) {
        const int first = s.shard.whole() ? 0 : r / s.shard.copies * s.shard.copies;  // r holds copy r % copies
        if (first != r)
          check_copies_equal(s.name, by_rank[first] + s.offset, by_rank[r] + s.offset, size_t(s.numel()),
                             fmt::format("on tp rank {} and tp rank {}", first, r));
      }
    full = assemble_full(table, by_rank);
  }
  if (mesh.tp_rank() != 0) return;
  // 2. Every stage's tensors to pipeline rank 0, in its rank table's order (the receiver knows the layout).
  if (mesh.pp_rank() != 0) {
    std::vector<float> packed;
    for (const auto& t : full) packed.insert(packed.end(), t.begin(), t.end());
    comms.pp->send(Tensor(packed.data(), {int64_t(packed.size())}, DType::F32), 0, kGatherTag);
    return;
  }
  std::map<std::string, std::vector<float>> by_name;  // the tied wte: stage 0's copy (both are equal)
  for (int i = 0; i < table.size(); ++i) by_name.emplace(table[i].name, std::move(full[i]));
  for (int r = 1; r < mesh.pp(); ++r) {
    const ParamTable t = PipelineChunks::rank_table(base, TensorSharding{}, layers_per_stage, mesh.pp(), r);
    std::vector<float> packed(full_numel(t));
    comms.pp->recv(Tensor(packed.data(), {int64_t(packed.size())}, DType::F32), r, kGatherTag);
    size_t at = 0;
    for (const ParamSpec& s : t.specs()) {
      std::vector<float> values(packed.begin() + at, packed.begin() + at + s.full_numel());
      at += s.full_numel();
      auto [it, added] = by_name.emplace(s.name, std::move(values));
      if (!added) {
        CHECK(it->second.size() == values.size(), "gathering the model: {} has {} elements on stage 0 and {} on "
              "stage {}", s.name, it->second.size(), values.size(), r);
        check_copies_equal(s.name, it->second.data(), values.data(), values.size(),
                           fmt::format("on stage 0 and stage {} of {}", r, mesh.pp()));
      }
    }
  }
  // 3. The single-rank model's layout and names.
  const ParamTable whole = gpt_param_table(base);
  std::vector<std::vector<float>> ordered;
  for (const ParamSpec& s : whole.specs()) {
    auto it = by_name.find(s.name);
    CHECK(it != by_name.end(), "gathering the model: no stage sent {}", s.name);
    ordered.push_back(std::move(it->second));
  }
  write_full_safetensors(path, whole, ordered);
}

}  // namespace mt
