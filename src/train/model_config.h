// The GPTConfig of a config's model section: the whole model (each rank's part is cut from it with a ModelPart,
// model/model_part.h; checkpoints and the export use it as it is).
#pragma once
#include "model/gpt.h"
#include "train/config.h"

namespace mt {

inline GPTConfig gpt_config(const ModelConfig& m) {
  GPTConfig g;
  g.arch = m.arch;
  g.n_kv_head = m.n_kv_head;
  g.ffn_hidden = m.ffn_hidden;
  g.multiple_of = m.multiple_of;
  g.norm_eps = m.norm_eps;
  g.rope_theta = m.rope_theta;
  g.tie_embeddings = m.tie_embeddings;
  g.n_layer = m.n_layer;
  g.n_head = m.n_head;
  g.d_model = m.d_model;
  g.seq_len = m.seq_len;
  g.vocab_size = m.vocab_size;
  return g;
}

// The same with the run's recomputation policy (train.recompute), which shapes the activation records.
inline GPTConfig gpt_config(const Config& c) {
  GPTConfig g = gpt_config(c.model);
  g.recompute = c.train.recompute;
  return g;
}

}  // namespace mt
