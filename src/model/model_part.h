// Which part of the whole model one GPT object holds. GPTConfig (model/gpt.h) describes the whole model and nothing
// of how it is parallelised; the trainer cuts each rank's part out of it from outside, with two declarations:
//
//   blocks    a pipeline stage: the slice [begin, end) of the model's block list. The slice that starts at block 0
//             also holds the embedding; the one that ends at the last block holds the final norm and the head.
//   sharding  the tensor-parallel plan: tp ranks, this one `rank`, and Megatron sequence parallelism. Every
//             parameter's shard is declared in its entry of the parameter table (Shard, model/param_table.h);
//             every activation's by one of the rules below, by which the blocks size their records:
//
//   activation                                         rule          rank r holds
//   residual stream, norms' outputs and statistics     rows(N)       all N rows; N/tp rows (r's block) under sp
//   attention q|k|v and output, MLP hidden (GPT-2's    cols(width)   width/tp columns: its heads, its hidden units
//     c_fc, Llama's gate, up and SwiGLU)
//   attention probabilities                            cols(NH)      NH/tp heads
//   Llama's k and v                                    kv_heads(KV)  KV/tp kv heads, or one when tp > KV
//   logits (the head's output)                         cols(Vp)      Vp/tp vocabulary rows (vocab-parallel)
//
// Context parallelism cuts the sequence itself; it needs no declaration here, only the cp communicator
// (GPT::set_cp_comm), because every shape follows from the local sequence length the caller allocates for.
#pragma once
#include <cstdint>

namespace mt {

// Parameter names, initialisation and the 1/sqrt(2 n_layer) projection scale stay those of the whole model, so any
// cut starts from the same weights.
struct BlockSlice {
  int begin = 0, end = -1;  // blocks [begin, end) of the model's n_layer; end -1: through the last block
  int end_in(int n_layer) const { return end < 0 ? n_layer : end; }
  int size(int n_layer) const { return end_in(n_layer) - begin; }
  bool first() const { return begin == 0; }                              // holds the embedding
  bool last(int n_layer) const { return end_in(n_layer) == n_layer; }  // holds the final norm and the head
};

// Megatron sequence parallelism (only with tp > 1): each tp rank holds a contiguous block of N/tp rows of the
// residual stream and the norm regions, rows [rank * N/tp, (rank + 1) * N/tp) of the flattened [B*T] rows (row
// (b, t) at b*T + t). For micro-batch 1 that is exactly a split of the sequence; in general it shards the same
// per-row work. Needs N % tp == 0 (seq_len % tp == 0 makes every block whole (b, t) rows).
struct TensorSharding {
  int tp = 1, rank = 0;
  bool sequence_parallel = false;

  bool sp() const { return tp > 1 && sequence_parallel; }
  int64_t rows(int64_t n) const { return sp() ? n / tp : n; }
  int64_t cols(int64_t width) const { return width / tp; }
  // Llama's kv heads on a rank: kv / tp, or one when tp exceeds them (each then held by tp / kv ranks: copies).
  int kv_heads(int kv) const { return kv >= tp ? kv / tp : 1; }
  int kv_copies(int kv) const { return kv >= tp ? 1 : tp / kv; }
};

struct ModelPart {
  BlockSlice blocks;
  TensorSharding sharding;
};

}  // namespace mt
