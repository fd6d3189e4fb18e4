#include "train/ignored_settings.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "parallel/compress_method.h"
#include "train/grad_reducers.h"

namespace mt {

namespace {

struct Rule {
  std::vector<const char*> keys;
  std::function<bool(const Config&, const DeviceMesh&)> applies;
  const char* why;  // where the keys apply
};

// comm.adapt may choose method m for the gradient buckets (comm.adapt_compress; "" = comm.compress alone).
bool adapt_may_choose(const Config& c, CompressMethod m) {
  if (!c.comm.adapt || c.optim.sync_every > 0) return false;
  std::vector<CompressMethod> methods;
  std::string bad;
  parse_compress_list(c.comm.adapt_compress, methods, bad);
  return std::find(methods.begin(), methods.end(), m) != methods.end();
}

bool compresses_with(const Config& c, CompressMethod m) { return c.comm.compress == m || adapt_may_choose(c, m); }

const std::vector<Rule>& rules() {
  static const std::vector<Rule> all = {
      {{"precision.loss_scale"}, [](const Config& c, const DeviceMesh&) { return c.precision.compute == DType::F16; },
       "loss scaling applies to precision.compute=fp16 only"},
      {{"optim.zero_reduce"}, [](const Config& c, const DeviceMesh&) { return c.optim.zero == 2; },
       "it applies to optim.zero=2 only"},
      {{"optim.zero_unit"}, [](const Config& c, const DeviceMesh&) { return sharded_gradients(c); },
       "it applies to optim.zero=3 and to optim.zero=2 reducing every micro-batch only"},
      {{"parallel.reshard_after_forward"}, [](const Config& c, const DeviceMesh&) { return c.optim.zero == 3; },
       "it applies to optim.zero=3 only"},
      {{"parallel.sequence_parallel"}, [](const Config& c, const DeviceMesh&) { return c.parallel.tp > 1; },
       "it applies to parallel.tp >= 2 only"},
      {{"data.path"}, [](const Config& c, const DeviceMesh&) { return c.data.source != DataSource::Synthetic; },
       "data.source=synthetic generates its tokens (set data.source=text or tokens to train on the file)"},
      {{"data.val_path"}, [](const Config& c, const DeviceMesh&) { return c.data.source != DataSource::Synthetic; },
       "data.source=synthetic holds out its own validation tokens (data.val_fraction)"},
      {{"optim.beta1", "optim.beta2", "optim.eps"},
       [](const Config& c, const DeviceMesh&) { return c.optim.name == OptimizerKind::AdamW; },
       "it applies to optim.name=adamw only"},
      {{"optim.momentum"}, [](const Config& c, const DeviceMesh&) { return c.optim.name == OptimizerKind::SGD; },
       "it is optim.name=sgd's momentum"},
      {{"optim.outer"}, [](const Config& c, const DeviceMesh&) { return c.optim.sync_every > 0; },
       "it is local SGD's outer optimizer: set optim.sync_every (the steps between averages) to train with it"},
      {{"optim.outer_lr", "optim.outer_momentum"},
       [](const Config& c, const DeviceMesh&) {
         return c.optim.sync_every > 0 && c.optim.outer == OuterOptimizer::Nesterov;
       },
       "it applies to optim.outer=nesterov under local SGD (optim.sync_every >= 1) only"},
      {{"optim.staleness_policy"}, [](const Config& c, const DeviceMesh&) { return c.optim.staleness > 0; },
       "it applies to optim.staleness >= 1 only"},
      {{"comm.bucket_mb", "comm.overlap"}, [](const Config& c, const DeviceMesh&) { return c.optim.sync_every == 0; },
       "local SGD (optim.sync_every) averages parameters, not gradient buckets"},
      {{"comm.topk_fraction"},
       [](const Config& c, const DeviceMesh&) { return compresses_with(c, CompressMethod::TopK); },
       "it applies to comm.compress=topk (or comm.adapt allowed to choose it) only"},
      {{"comm.powersgd_rank"},
       [](const Config& c, const DeviceMesh&) { return compresses_with(c, CompressMethod::PowerSGD); },
       "it applies to comm.compress=powersgd (or comm.adapt allowed to choose it) only"},
      {{"comm.hierarchical"}, [](const Config&, const DeviceMesh& m) { return m.replicas() > 1; },
       "this mesh has one replica, so no data-parallel all-reduce to split into nodes"},
      {{"comm.adapt_bucket_mb_min", "comm.adapt_bucket_mb_max", "comm.adapt_compress", "comm.adapt_every"},
       [](const Config& c, const DeviceMesh&) { return c.comm.adapt && c.optim.sync_every == 0; },
       "it applies to comm.adapt=true choosing the gradient buckets (synchronous data parallelism) only"},
      {{"comm.adapt_sync_every_min", "comm.adapt_sync_every_max"},
       [](const Config& c, const DeviceMesh&) { return c.comm.adapt && c.optim.sync_every > 0; },
       "it applies to comm.adapt=true choosing local SGD's period (optim.sync_every >= 1) only"},
      {{"comm.emulate.inter_latency_us", "comm.emulate.inter_bandwidth_gbps"},
       [](const Config& c, const DeviceMesh&) { return c.comm.emulate.ranks_per_node > 0; },
       "it is the link between emulated nodes: set comm.emulate.ranks_per_node"},
      {{"run.check_copies_every"},
       [](const Config& c, const DeviceMesh& m) {
         const bool tied = c.model.arch == ModelArch::GPT2 || c.model.tie_embeddings;
         return (m.replicas() > 1 && c.optim.zero < 3) || m.tp() > 1 || (m.pp() > 1 && tied);
       },
       "this mesh holds no copies of a weight to compare (one replica, or ZeRO-3's, which keep no whole copy; no "
       "tp; no tied embedding over pp)"},
      {{"train.straggler.delay_sigma"},
       [](const Config& c, const DeviceMesh&) { return c.train.straggler.delay_ms > 0; },
       "it shapes train.straggler.delay_ms's delays, and that is 0"},
  };
  return all;
}

}  // namespace

std::vector<std::string> ignored_settings(const Config& cfg, const DeviceMesh& mesh) {
  static const Config defaults;
  std::vector<std::string> out;
  for (const Rule& rule : rules()) {
    if (rule.applies(cfg, mesh)) continue;
    for (const char* key : rule.keys) {
      const std::string value = config_value(cfg, key);
      if (value != config_value(defaults, key))
        out.push_back(fmt::format("{}={} is ignored: {}", key, value, rule.why));
    }
  }
  return out;
}

}  // namespace mt
