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
  const int64_t n = model.table().total_numel();
  Tensor master = Tensor::zeros({n}, DType::F32), m = Tensor::zeros({n}, DType::F32), v = Tensor::zeros({n}, DType::F32);
  load_checkpoint(info, model.table(), master, m, v);
  opt.load_state(master, m, v, info.state.optimizer_steps);
  copy_convert(model.params(), master);  // the compute copy: the masters' rounding (or the fp32 weights)
  info.files.clear();                    // the shards' bytes are no longer needed
  return info;
}

}  // namespace mt
