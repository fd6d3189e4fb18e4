// Checkpoint shards out of, and state back into, the model and optimizer (see resume.h).
#include "train/resume.h"

namespace mt {

CheckpointShard checkpoint_shard(const PipelineChunks& model, const Optimizer& opt, const DeviceMesh& mesh, bool zero) {
  CheckpointShard shard;
  shard.table = &model.table();
  if (zero || mesh.dp_rank() == 0)
    for (const OptimSegment& g : opt.segments())
      if (g.numel > 0 && g.in_norm)
        shard.pieces.push_back({g.offset, g.numel, opt.master_view(g, model.params()).data_as<float>(),
                                opt.exp_avg_view(g).data_as<float>(), opt.exp_avg_sq_view(g).data_as<float>()});
  shard.rank = mesh.rank();
  shard.world = mesh.world_size();
  return shard;
}

CheckpointInfo restore_checkpoint(const std::string& dir, const Config& cfg, PipelineChunks& model, Optimizer& opt) {
  CheckpointInfo info = read_checkpoint(dir, cfg);
  const ParamTable& t = model.table();
  load_checkpoint(info, t, [&](int p, const float* master, const float* m, const float* v) {
    const Shape n{t[p].numel()};
    // The compute copy: the masters' rounding (or, in fp32, the weights themselves).
    copy_convert(model.params().slice(t[p].offset, n), Tensor(const_cast<float*>(master), n, DType::F32));
    opt.load_state(t[p].offset, t[p].numel(), master, m, v);
  });
  opt.set_steps_taken(info.state.optimizer_steps);
  info.files.clear();  // the shards' bytes are no longer needed
  return info;
}

}  // namespace mt
