// Checkpoint shards out of, and state back into, the model and optimizer (see resume.h).
#include "train/resume.h"

namespace mt {

CheckpointShard checkpoint_shard(const PipelineChunks& model, const Optimizer& opt, const DeviceMesh& mesh, bool zero) {
  const int64_t n = model.table().total_numel();
  CheckpointShard shard;
  shard.table = &model.table();
  shard.master = Tensor::zeros({n}, DType::F32);
  shard.exp_avg = Tensor::zeros({n}, DType::F32);
  shard.exp_avg_sq = Tensor::zeros({n}, DType::F32);
  opt.store_state(model.params(), shard.master, shard.exp_avg, shard.exp_avg_sq);
  if (zero || mesh.dp_rank() == 0)
    for (const OptimSegment& g : opt.segments())
      if (g.numel > 0 && g.in_norm) shard.ranges.emplace_back(g.offset, g.offset + g.numel);
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
