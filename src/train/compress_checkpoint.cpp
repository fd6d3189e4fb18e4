// Gradient compression's state in checkpoints (see compress_checkpoint.h).
#include "train/compress_checkpoint.h"

#include <fmt/format.h>

#include <cstdlib>

namespace mt {

namespace {

// The tensor (and __metadata__ key of the draw count) of a Q: the matrix is this tp rank's shard of the parameter.
std::string q_name(const std::string& param, const DeviceMesh& mesh) {
  return fmt::format("powersgd_q/{}/tp{}of{}", param, mesh.tp_rank(), mesh.tp());
}

// The last stage's copy of the tied wte: left to the first stage's.
bool tied_head_copy(const PipelineChunks& model, int c, const std::string& name) {
  return c == model.tied_chunk() && model.tied_copy_is_head() &&
         name == model.chunk(c).table()[model.tied_param()].name;
}

}  // namespace

std::string residual_kind(int q) { return fmt::format("replica{}/{}", q, kResidualKind); }

void add_compression_state(ChunkReducers& red, const PipelineChunks& model, const DeviceMesh& mesh,
                           CheckpointShard& shard) {
  for (int c = 0; c < model.size(); ++c) {
    if (!red.owned[c] || !red.owned[c]->residual().defined()) continue;
    const float* residual = red.owned[c]->residual().data_as<float>();  // on the host
    for (const ParamSpec& s : model.chunk(c).table().specs())
      if (!tied_head_copy(model, c, s.name))
        shard.pieces.push_back({model.base(c) + s.offset, s.numel(),
                                {{residual_kind(mesh.replica_rank()), residual + s.offset}}});
    if (mesh.replica_rank() != 0) continue;
    for (const LowRankState& st : red.owned[c]->low_rank_state()) {
      if (tied_head_copy(model, c, st.name)) continue;
      const std::string name = q_name(st.name, mesh);
      shard.tensors.push_back({name, st.q.data_as<float>(), st.q.numel()});
      shard.metadata[name] = std::to_string(*st.draws);
    }
  }
}

std::string restore_compression_state(ChunkReducers& red, const PipelineChunks& model, const DeviceMesh& mesh,
                                      const CheckpointInfo& info) {
  bool feedback = false;
  for (const auto& r : red.owned) feedback |= r && r->residual().defined();
  if (!feedback) return "";
  const std::string kind = residual_kind(mesh.replica_rank());
  if (checkpoint_has(info, kind)) {
    const ParamTable& t = model.table();
    load_checkpoint_fields(info, t, {kind}, [&](int p, const std::vector<const float*>& x) {
      int c = 0;  // the chunk holding parameter p (chunks need not lie in order in the flat layout)
      while (t[p].offset < model.base(c) || t[p].offset >= model.base(c) + model.chunk(c).table().total_numel()) ++c;
      Tensor e = red.owned[c]->residual().slice(t[p].offset - model.base(c), {t[p].numel()});
      copy_convert(e, Tensor(const_cast<float*>(x[0]), {t[p].numel()}, DType::F32));
    });
  }
  int missing = 0, total = 0;
  for (auto& r : red.owned) {
    if (!r) continue;
    for (const LowRankState& st : r->low_rank_state()) {
      ++total;
      const std::string name = q_name(st.name, mesh);
      const SafetensorInfo* found = nullptr;
      const SafetensorsFile* in = nullptr;
      for (const SafetensorsFile& f : info.files)
        if ((found = f.find(name))) {
          in = &f;
          break;
        }
      const auto draws = found ? in->metadata().find(name) : std::map<std::string, std::string>::const_iterator();
      if (!found || SafetensorsFile::numel(*found) != st.q.numel() || draws == in->metadata().end()) {
        ++missing;
        continue;
      }
      in->read_as_float(*found, st.q.data_as<float>(), st.q.numel());
      *st.draws = std::strtoull(draws->second.c_str(), nullptr, 10);
    }
  }
  if (!missing) return "";
  return fmt::format("PowerSGD's Q starts from a fresh draw for {} of {} matrices (the checkpoint has none for this "
                     "tp degree, matrix shape and rank)", missing, total);
}

}  // namespace mt
