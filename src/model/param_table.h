// The parameter table: every parameter's global name (GPT-2 Hugging Face names), its shapes, how it is sharded
// over tensor parallelism, whether weight decay applies, and its offset in this rank's flat parameter and
// gradient buffers. Offsets follow the order parameters are added; the GPT adds them in reverse order of use, so
// gradients that finish first during the backward pass sit first in the gradient buffer (and will form the first
// data-parallel bucket).
//
// Three shapes per parameter:
//   full_shape    the tensor as exported to / imported from safetensors (unpadded, all tp ranks together)
//   global_shape  all tp ranks together, padded (differs from full_shape only for wte: [Vp, C] against [V, C])
//   shape         this rank's shard of global_shape, as stored in the flat buffers
// Padding only ever adds trailing rows (dim 0), so the first full_shape.numel() elements of the global tensor,
// in row-major order, ARE the full tensor: a global element index g < full_numel() is also the element's index
// in the exported tensor, and g >= full_numel() is padding (zero, never exported, never given a gradient).
//
// Tensor-parallel layout (Megatron-LM, "Efficient large-scale language model training on GPU clusters"), for
// tp ranks, tp_rank r, C channels, NH heads, Vp = padded_vocab(V, tp). Weights are stored [in, out] (GPT-2's
// Conv1D), so "column-parallel" splits dim 1 (outputs) and "row-parallel" splits dim 0 (inputs):
//
//   parameter               global   split  groups  local      rank r holds
//   wte.weight              [Vp, C]  0      1       [Vp/tp, C] vocabulary rows [r*Vp/tp, (r+1)*Vp/tp) (vocab-parallel)
//   wpe.weight              [T, C]   -      -       [T, C]     all (replicated)
//   ln_1.*, ln_2.*, ln_f.*  [C]      -      -       [C]        all (replicated)
//   attn.c_attn.weight      [C, 3C]  1      3       [C, 3C/tp] q, k and v columns of heads [r*NH/tp, (r+1)*NH/tp),
//                                                              as q_r | k_r | v_r (column-parallel)
//   attn.c_attn.bias        [3C]     0      3       [3C/tp]    the same q_r | k_r | v_r entries
//   attn.c_proj.weight      [C, C]   0      1       [C/tp, C]  input rows of those heads (row-parallel)
//   attn.c_proj.bias        [C]      -      -       [C]        all (replicated: added once, after the all-reduce)
//   mlp.c_fc.weight         [C, 4C]  1      1       [C, 4C/tp] hidden columns [r*4C/tp, (r+1)*4C/tp) (column-par.)
//   mlp.c_fc.bias           [4C]     0      1       [4C/tp]    the same hidden units
//   mlp.c_proj.weight       [4C, C]  0      1       [4C/tp, C] input rows of those hidden units (row-parallel)
//   mlp.c_proj.bias         [C]      -      -       [C]        all (replicated)
// (layer parameters are named h.<l>.<name>; replicated parameters still record parts = tp and part = tp_rank).
//
// General rule (Shard below): view the global shape as [outer, D, inner] around the split dimension; D is cut
// into `groups` equal groups, each group into `parts` equal chunks; rank `part` holds chunk `part` of every
// group, concatenated in group order. Each (outer, group) chunk is one contiguous run of chunk*inner elements
// both locally and globally (run_length(), run_global_begin()). With groups = 3 the local c_attn output is
// q_r|k_r|v_r, exactly the qkv layout the attention kernel expects for NH/tp heads.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mt {

// How a parameter is split over the ranks of its tensor-parallel group.
struct Shard {
  int dim = -1;    // dimension of global_shape that is split; -1: replicated (every rank holds all of it)
  int parts = 1;   // the tp degree
  int part = 0;    // this rank's tp_rank
  int groups = 1;  // interleaved groups along dim, each cut into `parts` chunks (c_attn: q|k|v -> 3)
  // Parts held by several tp ranks each (Llama's k and v when n_kv_head < tp): tp = parts x copies, tp rank r
  // holds part r / copies as copy r % copies. Every copy holds the same values.
  int copies = 1, copy = 0;
  // True when this rank holds the whole global tensor (replicated, or tp = 1).
  bool whole() const { return dim < 0 || parts == 1; }
  // True when a sum over this rank's elements (the gradient norm's) must be added over tp to count each element
  // once: the tp ranks hold different parts, or copies of which only copy 0 counts. A single part held as copies
  // (n_kv_head = 1) is whole() on every rank, yet counts on one rank only.
  bool summed_over_tp() const { return !whole() || copies > 1; }
};

struct ParamSpec {
  std::string name;
  Shape shape;         // local: this rank's shard, as stored in the flat buffers
  Shape global_shape;  // all tp ranks together, padded (wte's rows: the padded vocabulary)
  Shape full_shape;    // as exported (unpadded)
  Shard shard;
  bool decay = false;  // AdamW weight decay: matrices and embeddings only
  int64_t offset = 0;  // in elements, into the flat buffers

  int64_t numel() const { return shape.numel(); }
  int64_t full_numel() const { return full_shape.numel(); }
  // Contiguous runs: the local shard is num_runs() runs of run_length() elements each; run q starts at local
  // element q * run_length() and at global element run_global_begin(q). A whole (unsplit) tensor is one run.
  int64_t run_length() const;
  int64_t num_runs() const;
  int64_t run_global_begin(int64_t run) const;
  // Local element index -> global (padded, row-major) element index.
  int64_t global_index(int64_t local) const;
  // A global element index that lies in the padding (only wte's rows >= vocab_size).
  bool is_padding(int64_t global) const { return global >= full_numel(); }
  // The same parameter as tp rank `part` holds it (same shapes and offset, shard.part replaced).
  ParamSpec for_part(int part) const;
};

class ParamTable {
 public:
  // Adds a parameter at the end of the flat buffers and returns its index. `global_shape` is the padded shape of
  // the whole tensor over all tp ranks; the local shape follows from `shard` (replicated by default, so the
  // local shape is the global shape). CHECKs that the split dimension divides into groups * parts and that
  // padding, if any, only adds rows.
  int add(const std::string& name, Shape global_shape, Shape full_shape, bool decay, Shard shard = {});
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const ParamSpec& operator[](int i) const { return specs_[i]; }
  int size() const { return static_cast<int>(specs_.size()); }
  int64_t total_numel() const { return total_; }
  int index_of(const std::string& name) const;  // -1 when absent

 private:
  std::vector<ParamSpec> specs_;
  int64_t total_ = 0;
};

}  // namespace mt
