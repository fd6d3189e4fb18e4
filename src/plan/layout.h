// A layout: one way to run a config on N ranks (the mesh with its context-parallel degree, the pipeline schedule, the
// micro-batch size and ZeRO),
// and the enumeration of every layout that the trainer's validate(cfg, world) accepts.
#pragma once
#include <string>
#include <vector>

#include "train/config.h"

namespace mt::plan {

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  int virtual_stages = 1;
  int micro_batch = 1;
  int zero = 0;
  int cp = 1;  // context parallelism: each sequence split over cp ranks

  bool operator==(const Layout& o) const;
  bool operator<(const Layout& o) const;  // a fixed order (dp, cp, tp, pp, schedule, v, micro_batch, zero)
};

// The schedules a layout may use, in the order the enumeration tries them.
const std::vector<PipelineSchedule>& layout_schedules();

// `base` with the layout's keys set: parallel.dp/cp/tp/pp/schedule/virtual_stages, train.micro_batch, optim.zero.
// Every other key (model, global_batch, precision, network, stage_layers, ...) stays as given.
Config apply_layout(const Config& base, const Layout& l);

// Whether validate(apply_layout(base, l), world) accepts the layout; `why` (optional) gets the message if not.
bool layout_valid(const Config& base, const Layout& l, int world, std::string* why = nullptr);

// Every valid layout for `world` ranks, in Layout's order: dp*cp*tp*pp = world (cp from 1 while seq_len divides by
// 2 cp, as the ring's zigzag split needs), each schedule, virtual_stages 1..n_layer for interleaved (1 otherwise),
// micro_batch over the divisors of global_batch / dp, and zero 0 to 3 where dp x cp > 1 (ZeRO shards over those
// replicas; with one, zero 0 only); kept when layout_valid. Throws InputError when world < 1.
// parallel.reshard_after_forward (ZeRO-3) is not a layout key: it comes from the config, as every other key does.
std::vector<Layout> enumerate_layouts(const Config& base, int world);

// The --set overrides that turn `base` into the layout: each layout key whose value differs from base's
// ("parallel.pp=2", ...; parallel.dp whenever base leaves it to the rank count and that would give another dp).
std::vector<std::string> layout_overrides(const Config& base, const Layout& l, int world);

// "dp2 tp1 pp2 1f1b mb4 zero1" (interleaved adds "v2", context parallelism "cp2" after dp).
std::string describe(const Layout& l);

// Micro-batches per step: global_batch / (dp * micro_batch).
int micro_batches(const Config& base, const Layout& l);

}  // namespace mt::plan
