// A pipeline rank's model chunks over shared flat buffers (see pipeline_chunks.h).
#include "model/pipeline_chunks.h"

#include <numeric>

namespace mt {

BlockSlice stage_blocks(const std::vector<int>& layers_per_stage, int stage) {
  CHECK(stage >= 0 && stage < static_cast<int>(layers_per_stage.size()), "stage {} of {}", stage,
        layers_per_stage.size());
  const int begin = std::accumulate(layers_per_stage.begin(), layers_per_stage.begin() + stage, 0);
  return {begin, begin + layers_per_stage[stage]};
}

namespace {

// Appends every parameter of `t` to `out`; returns the offset of t's first parameter in out. Offsets are
// 16-aligned in both tables, so each parameter keeps its offset relative to the chunk's start.
int64_t append_table(ParamTable& out, const ParamTable& t) {
  int64_t base = -1;
  for (const ParamSpec& s : t.specs()) {
    const int i = out.add(s.name, s.global_shape, s.full_shape, s.decay, s.shard);
    if (base < 0) base = out[i].offset - s.offset;
    CHECK(out[i].offset == base + s.offset, "chunk layout: {} at {} instead of {}", s.name, out[i].offset,
          base + s.offset);
  }
  return base;
}

int chunks_per_rank(const GPTConfig& model, const std::vector<int>& layers_per_stage, int p) {
  CHECK(std::accumulate(layers_per_stage.begin(), layers_per_stage.end(), 0) == model.n_layer,
        "the stages' blocks do not add up to n_layer {}", model.n_layer);
  CHECK(p >= 1 && !layers_per_stage.empty() && layers_per_stage.size() % p == 0,
        "{} pipeline stages do not divide over {} ranks", layers_per_stage.size(), p);
  return static_cast<int>(layers_per_stage.size()) / p;
}

}  // namespace

ParamTable PipelineChunks::rank_table(const GPTConfig& model, const TensorSharding& sharding,
                                      const std::vector<int>& layers_per_stage, int p, int rank) {
  ParamTable t;
  for (int c = chunks_per_rank(model, layers_per_stage, p) - 1; c >= 0; --c)
    append_table(t, gpt_param_table(model, {stage_blocks(layers_per_stage, c * p + rank), sharding}));
  return t;
}

PipelineChunks::PipelineChunks(const GPTConfig& model, const TensorSharding& sharding,
                               const std::vector<int>& layers_per_stage, int p, int rank, DType dtype, Device device,
                               bool flat_grads, bool flat_params)
    : p_(p), rank_(rank), num_stages_(static_cast<int>(layers_per_stage.size())), dtype_(dtype), device_(device) {
  CHECK(flat_params || !flat_grads, "PipelineChunks: a flat gradient buffer without a flat parameter buffer");
  const int v = chunks_per_rank(model, layers_per_stage, p);
  auto part = [&](int c) { return ModelPart{stage_blocks(layers_per_stage, stage(c)), sharding}; };
  CHECK(rank >= 0 && rank < p, "pipeline rank {} of {}", rank, p);
  std::vector<ParamTable> tables(v);
  base_.assign(v, 0);
  for (int c = v - 1; c >= 0; --c) {
    tables[c] = gpt_param_table(model, part(c));
    base_[c] = append_table(table_, tables[c]);
  }
  if (flat_params) params_ = Tensor::zeros({std::max<int64_t>(1, table_.total_numel())}, dtype, device);
  if (flat_grads) grads_ = Tensor::zeros({std::max<int64_t>(1, table_.total_numel())}, acc_dtype(dtype), device);
  for (int c = 0; c < v; ++c) {
    const Shape n{tables[c].total_numel()};
    chunks_.push_back(std::make_unique<GPT>(model, part(c), dtype, device,
                                            flat_params ? params_.slice(base_[c], n) : Tensor(),
                                            flat_grads ? grads_.slice(base_[c], n) : Tensor(), !flat_params));
    if (num_stages_ > 1 && model.tied() && (stage(c) == 0 || stage(c) == num_stages_ - 1)) {
      tied_chunk_ = c;
      tied_param_ = chunks_[c]->embedding_param();
    }
  }
}

int64_t PipelineChunks::num_parameters() const {
  int64_t n = 0;
  const ParamTable table = gpt_param_table(chunks_[0]->config());
  for (const ParamSpec& s : table.specs()) n += s.full_shape.numel();
  return n;
}

void PipelineChunks::set_tp_comm(Communicator* tp) {
  for (auto& c : chunks_) c->set_tp_comm(tp);
}

void PipelineChunks::set_cp_comm(Communicator* cp) {
  for (auto& c : chunks_) c->set_cp_comm(cp);
}

Tensor PipelineChunks::chunk_view(const Tensor& flat, int c) const {
  return flat.defined() ? flat.slice(base_[c], {chunks_[c]->table().total_numel()}) : Tensor();
}

void PipelineChunks::init(uint64_t seed, double std, const Tensor& into) {
  for (int c = 0; c < size(); ++c) chunks_[c]->init(seed, std, chunk_view(into, c));
}

void PipelineChunks::load_safetensors(const std::string& path, const Tensor& into) {
  for (int c = 0; c < size(); ++c) chunks_[c]->load_safetensors(path, chunk_view(into, c));
}

}  // namespace mt
