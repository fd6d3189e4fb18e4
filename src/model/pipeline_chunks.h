// The model chunks one pipeline rank holds. With p pipeline ranks and v chunks per rank the model is cut into
// S = p*v stages of contiguous transformer blocks (layers_per_stage[s] blocks for stage s); chunk c of rank r
// is stage s = c*p + r (Megatron's interleaved layout; v = 1: the stage is the rank). Stage 0 holds the
// embeddings, stage S-1 the final LayerNorm and the head; with S > 1 both hold a copy of the tied token
// embedding wte, whose gradients the trainer sums between them every step.
//
// All chunks of a rank share one flat parameter buffer and one flat gradient buffer, laid out chunk v-1 first
// and chunk 0 last: the reverse order in which their backward passes finish, so the optimizer, the ZeRO shards
// and the gradient buckets see one buffer as without pipelining. table() lists every chunk's parameters at
// their offsets in it.
#pragma once
#include <memory>
#include <vector>

#include "model/gpt.h"

namespace mt {

// Stage s's slice of the block list.
BlockSlice stage_blocks(const std::vector<int>& layers_per_stage, int stage);

class PipelineChunks {
 public:
  // Each chunk is the part {its stage's blocks, sharding} of `model`. CHECKs that layers_per_stage has p*v positive
  // entries summing to model.n_layer (config validation reports these as input errors first).
  // flat_grads = false: no flat gradient buffer (grads() undefined); each chunk's gradients live where
  // GPT::set_grad_views() puts them (ZeRO-2). flat_params = false (only with flat_grads = false): no flat parameter
  // buffer either (params() undefined); GPT::set_param_views() puts the parameters (ZeRO-3).
  PipelineChunks(const GPTConfig& model, const TensorSharding& sharding, const std::vector<int>& layers_per_stage,
                 int p, int rank, DType dtype, Device device = Device::CPU, bool flat_grads = true,
                 bool flat_params = true);

  // The rank-wide parameter table of pipeline rank `rank` without building its chunks (to know another
  // rank's layout, e.g. when gathering the model for export).
  static ParamTable rank_table(const GPTConfig& model, const TensorSharding& sharding,
                               const std::vector<int>& layers_per_stage, int p, int rank);

  int size() const { return static_cast<int>(chunks_.size()); }  // v
  int num_stages() const { return num_stages_; }
  int stage(int c) const { return c * p_ + rank_; }
  GPT& chunk(int c) { return *chunks_[c]; }
  const GPT& chunk(int c) const { return *chunks_[c]; }
  int64_t base(int c) const { return base_[c]; }  // chunk c's offset in the flat buffers
  const ParamTable& table() const { return table_; }
  Tensor params() const { return params_; }  // undefined without a flat parameter buffer
  DType dtype() const { return dtype_; }     // the compute dtype
  Device device() const { return device_; }
  Tensor grads() const { return grads_; }  // undefined without a flat gradient buffer
  int64_t num_parameters() const;  // of the whole model, as GPT-2 counts them

  void set_tp_comm(Communicator* tp);
  void set_cp_comm(Communicator* cp);  // GPT::set_cp_comm on every chunk
  // As GPT::init / load_safetensors; `into`, when given, is a buffer laid out like params() (e.g. fp32 masters).
  void init(uint64_t seed, double std, const Tensor& into = {});
  void load_safetensors(const std::string& path, const Tensor& into = {});
  // Chunk c's part of a flat buffer laid out like params() (undefined for an undefined buffer).
  Tensor chunk_view(const Tensor& flat, int c) const;

  // With more than one stage: the chunk holding a copy of the tied wte (stage 0 or stage S-1), else -1.
  int tied_chunk() const { return tied_chunk_; }
  // Whether this rank's copy of wte is the last stage's (the one left out of the gradient norm).
  bool tied_copy_is_head() const { return tied_chunk_ >= 0 && stage(tied_chunk_) == num_stages_ - 1; }
  // That copy's index in chunk(tied_chunk())'s table (requires tied_chunk() >= 0).
  int tied_param() const { return tied_param_; }

 private:
  int p_, rank_, num_stages_;
  DType dtype_;
  Device device_;
  Tensor params_, grads_;
  std::vector<std::unique_ptr<GPT>> chunks_;
  std::vector<int64_t> base_;
  ParamTable table_;
  int tied_chunk_ = -1, tied_param_ = -1;
};

}  // namespace mt
