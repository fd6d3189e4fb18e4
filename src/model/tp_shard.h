// Full tensors <-> tensor-parallel shards, through the parameter table (layout in model/param_table.h). Pure
// functions over host memory: no communication here (the trainer gathers the tp ranks' flat buffers over its tp
// communicator, or a test builds one GPT per tp rank, and passes them in).
#pragma once
#include <string>
#include <vector>

#include "model/param_table.h"

namespace mt {

// The full (unpadded) tensor of one parameter from every tp rank's flat buffer: flat_by_rank[r] is tp rank r's
// flat parameter (or gradient) buffer, laid out by `spec`'s table (all tp ranks share offsets and local shapes;
// spec may come from any rank's table). A sharded parameter needs exactly spec.shard.parts buffers; a
// replicated one is taken from rank 0. `full` receives spec.full_numel() elements.
void assemble_full_param(const ParamSpec& spec, const std::vector<const float*>& flat_by_rank, float* full);
// Every parameter's full tensor, in table order.
std::vector<std::vector<float>> assemble_full(const ParamTable& layout, const std::vector<const float*>& flat_by_rank);

// This rank's shard (spec.shard.part) of a full (unpadded) tensor: `local` receives spec.numel() elements,
// vocabulary padding set to zero.
void extract_shard(const ParamSpec& spec, const float* full, float* local);

// Writes full tensors (as from assemble_full, in table order) under their GPT-2 names as F32 safetensors: for
// the same weights, byte-identical to GPT::export_safetensors of a tp = 1 model.
void write_full_safetensors(const std::string& path, const ParamTable& layout,
                            const std::vector<std::vector<float>>& full);

}  // namespace mt
