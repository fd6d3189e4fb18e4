// Checkpoint shards out of, and state back into, the model and optimizer (see resume.h).
#include "train/resume.h"

#include "core/device.h"

namespace mt {

CheckpointShard checkpoint_shard(const PipelineChunks& model, const Tensor& params, const Optimizer& opt,
                                 const DeviceMesh& mesh, bool zero) {
  CheckpointShard shard;
  shard.table = &model.table();
  // The writer reads host memory: GPU state is downloaded (to_host waits for the step's kernels), host state
  // is viewed where it lives.
  auto host = [&](const Tensor& t) {
    if (t.device() == Device::CPU) return t.data_as<float>();
    shard.host_copies.push_back(to_host(t));
    return shard.host_copies.back().data_as<float>();
  };
  if (zero || mesh.replica_rank() == 0)
    for (const OptimSegment& g : opt.segments())
      if (g.numel > 0 && g.in_norm)
        shard.pieces.push_back({g.offset, g.numel, host(opt.master_view(g, params)),
                                host(opt.exp_avg_view(g)), host(opt.exp_avg_sq_view(g))});
  shard.rank = mesh.rank();
  shard.world = mesh.world_size();
  return shard;
}

CheckpointInfo restore_checkpoint(const std::string& dir, const Config& cfg, const PipelineChunks& model,
                                  Optimizer& opt, const WeightsSink& weights) {
  CheckpointInfo info = read_checkpoint(dir, cfg);
  const ParamTable& t = model.table();
  load_checkpoint(info, t, [&](int p, const float* master, const float* m, const float* v) {
    const Shape n{t[p].numel()};
    // The compute copy: the masters' rounding (or, in fp32, the weights themselves), uploaded where it lives on
    // a GPU (rounded on the host first: the same round-to-nearest-even as the optimizer's kernels).
    weights(Tensor(const_cast<float*>(master), n, DType::F32), t[p].offset);
    opt.load_state(t[p].offset, t[p].numel(), master, m, v);
  });
  opt.set_steps_taken(info.state.optimizer_steps);
  info.files.clear();  // the shards' bytes are no longer needed
  return info;
}

}  // namespace mt
