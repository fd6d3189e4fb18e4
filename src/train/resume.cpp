// Checkpoint shards out of, and state back into, the model and optimizer (see resume.h).
#include "train/resume.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/device.h"

namespace mt {

const float* checkpoint_host_view(CheckpointShard& shard, const Tensor& t) {
  if (t.device() == Device::CPU) return t.data_as<float>();
  shard.host_copies.push_back(to_host(t));
  return shard.host_copies.back().data_as<float>();
}

CheckpointShard checkpoint_shard(const PipelineChunks& model, const Tensor& params, const Optimizer& opt,
                                 const DeviceMesh& mesh, bool zero) {
  CheckpointShard shard;
  shard.table = &model.table();
  auto host = [&](const Tensor& t) { return checkpoint_host_view(shard, t); };
  if (zero || mesh.replica_rank() == 0)
    for (const OptimSegment& g : opt.segments())
      if (g.numel > 0 && g.in_norm)
        shard.pieces.push_back({g.offset, g.numel, {{kMasterKind, host(opt.master_view(g, params))},
                                                    {kExpAvgKind, host(opt.exp_avg_view(g))},
                                                    {kExpAvgSqKind, host(opt.exp_avg_sq_view(g))}}});
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
  return info;
}

std::vector<std::string> resume_changes(const std::string& yaml, const Config& cfg, int64_t step) {
  if (yaml.empty()) return {};
  YAML::Node parsed;
  try {
    parsed = YAML::Load(yaml);
  } catch (const std::exception&) {
    return {};  // the checkpoint's reader has already judged its config
  }
  const YAML::Node& then = parsed;  // read only: a missing key must not be created
  Config old = cfg;
  // "key old -> new" for each of `keys` whose value differs (the checkpoint's read into `old`).
  auto differing = [&](std::initializer_list<const char*> keys) {
    std::string list;
    for (const char* key : keys) {
      const std::string k(key), section = k.substr(0, k.find('.')), name = k.substr(k.find('.') + 1);
      const YAML::Node v = then.IsMap() && then[section].IsMap() ? then[section][name] : YAML::Node();
      if (!v || !v.IsScalar()) continue;
      try {
        apply_override(old, k + "=" + v.Scalar());
      } catch (const std::exception&) {
        continue;  // a value this version does not read: nothing to compare
      }
      if (config_value(old, k) != config_value(cfg, k))
        list += fmt::format("{}{} {} -> {}", list.empty() ? "" : ", ", k, config_value(old, k), config_value(cfg, k));
    }
    return list;
  };
  std::vector<std::string> out;
  const int next = int(step) + 1;
  const std::string schedule =
      differing({"train.steps", "optim.schedule", "optim.lr", "optim.min_lr", "optim.warmup_steps"});
  if (!schedule.empty())
    out.push_back(fmt::format(
        "the learning-rate schedule differs from the one the checkpoint of step {} trained under ({}): step {} takes "
        "lr {:.3e} where that one gives {:.3e} (step {} took {:.3e}); set those keys back to continue it", step,
        schedule, next, lr_schedule(cfg).at(next), lr_schedule(old).at(next), step, lr_schedule(old).at(int(step))));
  const std::string update = differing({"optim.weight_decay", "optim.beta1", "optim.beta2", "optim.eps",
                                         "optim.momentum", "train.grad_clip"});
  if (!update.empty())
    out.push_back(fmt::format("the optimizer's settings differ from those the checkpoint of step {} trained with ({}): "
                              "steps from {} on update the weights otherwise; set those keys back to continue it",
                              step, update, next));
  // The batcher reads global sequence g of step s as sample s x global_batch + g of the stream (data/batcher.h),
  // in data.order's order of windows, seeded by train.seed.
  const std::string stream = differing({"train.global_batch", "train.seed", "data.order"});
  if (!stream.empty()) {
    const int64_t seen = step * old.train.global_batch, from = step * cfg.train.global_batch;
    std::vector<std::string> what;
    if (from != seen)
      what.push_back(fmt::format("step {} starts at sample {} where that run would have gone on from {}: samples "
                                 "{}-{} are {}", next, from, seen, std::min(from, seen), std::max(from, seen) - 1,
                                 from > seen ? "never trained on" : "trained on again"));
    const bool reseeded = cfg.train.seed != old.train.seed;
    if (reseeded && cfg.data.source == DataSource::Synthetic)
      what.push_back("the synthetic corpus is another one (train.seed seeds it)");
    if (cfg.data.order != old.data.order || (reseeded && cfg.data.order == DataOrder::Shuffle))
      what.push_back("the windows come in another order");
    std::string consequences;
    for (const std::string& w : what) consequences += "; " + w;
    out.push_back(fmt::format("the data stream differs from the one the checkpoint of step {} read ({}){}; set "
                              "those keys back to continue it", step, stream, consequences));
  }
  return out;
}

std::vector<std::string> resume_restarts(const Config& cfg) {
  std::vector<std::string> out;
  if (!cfg.comm.adapt) return out;
  const std::string what = cfg.optim.sync_every > 0 ? "local SGD period" : "bucket size and compression";
  out.push_back(fmt::format("comm.adapt: the controller's measurements are not in checkpoints; it starts again from "
                            "the checkpoint's {} and measures afresh, so this run may choose other {} than an "
                            "uninterrupted one would", what, cfg.optim.sync_every > 0 ? "periods" : "settings"));
  return out;
}

}  // namespace mt
