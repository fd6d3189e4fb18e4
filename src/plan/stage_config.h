// A pipeline stage as the planner sees it, without building it: the whole model and the part one of the stage's
// ranks holds (its blocks and tp shard, model/model_part.h; the tp rank is 0, every rank's shapes being equal).
#pragma once
#include <vector>

#include "model/gpt.h"
#include "model/pipeline_chunks.h"

namespace mt::plan {

struct StageConfig {
  GPTConfig model;
  ModelPart part;

  bool first() const { return part.blocks.first(); }
  bool last() const { return part.blocks.last(model.n_layer); }
  int blocks() const { return part.blocks.size(model.n_layer); }
  int block_begin() const { return part.blocks.begin; }
  int tp() const { return part.sharding.tp; }
};

// Stage s of `model` cut by layers_per_stage, on tp ranks (sequence parallel when sp).
inline StageConfig stage_config(const GPTConfig& model, int tp, bool sp, const std::vector<int>& layers_per_stage,
                                int s) {
  return {model, {stage_blocks(layers_per_stage, s), {tp, 0, sp}}};
}

}  // namespace mt::plan
