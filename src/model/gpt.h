// A GPT-2 or Llama model (GPTConfig::arch) on one rank: the parameter table over flat parameter/gradient buffers,
// mesh-independent initialisation, and the forward and backward passes of one micro-batch: the embedding, a list of
// blocks (model/block.h: each family's block in model/gpt2_block.cpp and model/llama_block.cpp), the final norm and
// the head, with tensor parallelism in the layers of model/parallel_layers.h.
// Shapes use one vocabulary: B batch, T sequence, C channels, NH heads, HS head size, L layers, V vocab
// (Vp: padded to a multiple of kVocabAlign * tp), N = B*T rows.
// A GPT object holds one part of the whole model (model/model_part.h), cut from outside:
// - a pipeline stage, a slice of the block list: the first stage holds the embeddings, the last the final norm and
//   the (tied) head and loss; a middle stage reads its input residual stream from Activations::input() and leaves
//   its output in output();
// - one tp rank's shard of every parameter (layout table in model/param_table.h) and activation (the sharding
//   plan's rules), with Megatron sequence parallelism on the residual stream's rows.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/arena.h"
#include "core/tensor.h"
#include "model/context_parallel.h"
#include "model/model_arch.h"
#include "model/model_part.h"
#include "model/parallel_layers.h"
#include "model/param_table.h"
#include "model/recompute.h"

namespace mt {

// The whole model, nothing of its parallelism: a GPT object holds the ModelPart (model/model_part.h) it is given.
struct GPTConfig {
  // The block family: GPT-2 (LayerNorm with bias, learned positions, GELU MLP, biases, the head tied to the
  // embedding) or Llama (RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention, no biases, an untied head
  // unless tie_embeddings); model/llama_block.cpp holds Llama's table and block.
  ModelArch arch = ModelArch::GPT2;
  int n_layer = 4, n_head = 4, d_model = 128, seq_len = 64, vocab_size = 256;
  // Llama only: kv heads (0 = n_head; must divide n_head), the SwiGLU hidden size (0 = the multiple_of rule:
  // 2/3 of 4 d_model rounded up to a multiple of multiple_of), RMSNorm's eps, the rotary base, and whether the
  // head reads the embedding (GPT-2's always does).
  int n_kv_head = 0, ffn_hidden = 0, multiple_of = 256;
  double norm_eps = 1e-5, rope_theta = 10000.0;
  bool tie_embeddings = false;
  // Activation recomputation (model/recompute.h): which of a block's forward values its backward recomputes.
  Recompute recompute = Recompute::None;

  bool llama() const { return arch == ModelArch::Llama; }
  int kv_heads() const { return llama() && n_kv_head > 0 ? n_kv_head : n_head; }
  int head_size() const { return d_model / n_head; }
  int mlp_hidden() const { return llama() ? llama_mlp_hidden(d_model, ffn_hidden, multiple_of) : 4 * d_model; }
  bool tied() const { return !llama() || tie_embeddings; }
};

// Vocabulary padding: the LM head and embedding use Vp rows, a multiple of kVocabAlign * tp so every tp rank's
// vocabulary shard (Vp / tp rows) is kVocabAlign-aligned; tp = 1 gives a multiple of kVocabAlign. The padding is
// masked in the loss and never indexed by tokens, so it never changes the loss or any gradient.
constexpr int kVocabAlign = 64;
int padded_vocab(int vocab_size, int tp = 1);

// What the zero-bubble weight pass (GPT::backward_weights) needs of one block, kept by the input pass: the
// output gradients of its four matmuls (the inputs are in LayerActivations already).
struct LayerOutputGrads {
  Tensor d_fcproj;  // [N, C]: d/d(mlp.c_proj output), all rows
  Tensor dfch;      // [N, 4C/tp]: d/d(mlp.c_fc output)
  Tensor d_attproj; // [N, C]: d/d(attn.c_proj output), all rows
  Tensor dqkv;      // [N, 3C/tp]: d/d(attn.c_attn output)
  // Llama (d_fcproj and d_attproj are then the down and o projections'): the q, k, v, gate and up projections'.
  Tensor dq, dk, dv, dgate, dup;
};

// Everything one micro-batch's backward pass needs, allocated from an Arena (one record per micro-batch in
// flight). Stage-local layer i (global block blocks.begin + i) reads residual[i] and writes residual[i+1].
// With sequence parallelism (sp) the tensors marked "Ns" hold only this tp rank's N/tp rows (Ns = N/tp), else N.
struct LayerActivations {
  Tensor ln1, ln1_mean, ln1_rstd;  // [Ns, C], [Ns], [Ns]
  Tensor qkv;                      // [N, 3C/tp]: this rank's heads of q | k | v
  Tensor att;                      // [B, NH/tp, T, T] softmax probabilities
  Tensor atty;                     // [N, C/tp] attention output before c_proj
  Tensor res_attn;                 // [Ns, C] residual after attention: input of ln_2
  Tensor ln2, ln2_mean, ln2_rstd;  // [Ns, C], [Ns], [Ns]
  Tensor fch, fch_gelu;            // [N, 4C/tp]
  // Llama (ln1/ln2 and their rstd are the RMSNorms', qkv the expanded attention input [N, 3 NH/tp HS]): the
  // rotated q [N, NH/tp HS] and k, and v [N, KV/tp HS]; the SwiGLU's gate and up [N, H/tp] and output.
  Tensor q, k, v, gate, up, swiglu;
};

struct Activations {
  int B = 0, T = 0;
  Tensor tokens, targets;        // [B, T] int32, written by the caller before forward()
  std::vector<Tensor> residual;  // L + 1 tensors [Ns, C]: residual[0] is the embedding output
  std::vector<LayerActivations> layers;
  Tensor lnf, lnf_mean, lnf_rstd;  // [Ns, C], [Ns], [Ns]
  Tensor logits;                   // [N, Vp/tp] (this rank's vocabulary slice); replaced in place by d(loss)/d(logits) when targets are given
  Tensor losses;                   // [N] per-token cross-entropy
  Tensor xent_max, xent_stats;     // tp > 1: [N] and [2, N], the vocab-parallel cross-entropy's reduced rows
  Tensor sp_full;                  // sp: [N, C] scratch for all-gathered inputs and reduce-scattered outputs
  std::vector<LayerOutputGrads> wgrad;  // split backward only (zero-bubble): kept from the input pass
  Tensor demb;                          // split backward, first stage: [N, C] d/d(embedding output)

  const Tensor& input() const { return residual.front(); }  // [Ns, C]: a later stage's input, written by the caller
  const Tensor& output() const { return residual.back(); }  // [Ns, C]: an earlier stage's output, sent on
};

// A backward pass's request for the parameters of the flat layout's elements [begin, end) (GPT::backward).
using ParamsNeeded = std::function<void(int64_t begin, int64_t end)>;

// backward() in one pass, or split for zero-bubble schedules: InputOnly computes the gradient of the stage's
// input (and the LayerNorms' parameter gradients) and keeps what backward_weights() needs for the rest.
enum class BackwardPart { All, InputOnly };

// The parameter table of a model's part (the GPT constructor's layout), without allocating buffers.
ParamTable gpt_param_table(const GPTConfig& cfg, const ModelPart& part = {});
ParamTable llama_param_table(const GPTConfig& cfg, const ModelPart& part);  // gpt_param_table for Llama
std::string gpt2_layer_name(int layer, int slot);     // a GPT-2 block parameter's name (slot: its place in the block)
std::string llama_layer_name(int layer, int slot);    // a Llama block parameter's name

// Writes a Hugging Face GPT-2 config.json describing the whole model of `cfg`.
void write_hf_config(const std::string& path, const GPTConfig& cfg);

class Block;
class Norm;
struct BlockScratch;

class GPT {
 public:
  // dtype: the compute dtype of the parameters and activations: F32, BF16 or F16 for training (a 16-bit model
  // is the compute copy of fp32 master weights the optimizer keeps), F64 for gradient checks. Gradients,
  // LayerNorm statistics and losses are in acc_dtype(dtype) (fp32, or fp64 for fp64), so gradients accumulate
  // over micro-batches in fp32. Buffers are zero until init() or load_safetensors().
  // `part`: the blocks and the tp shard this object holds (model/model_part.h). CHECKs that n_head and the MLP's
  // width divide by its tp (the config validation reports these as input errors first), that 0 <= rank < tp
  // and that the blocks are a non-empty slice of the model's.
  // With `params` and `grads` given (each gpt_param_table(cfg, part).total_numel() elements of dtype and
  // acc_dtype(dtype), e.g. views into one rank-wide buffer holding several pipeline chunks) the model uses them
  // instead of allocating its own. `params` given without `grads`: the gradients live elsewhere, and
  // set_grad_views() must say where before the first backward pass (ZeRO-2's unit buffers). no_buffers: neither
  // buffer is given nor allocated; set_param_views() and set_grad_views() say where both live (ZeRO-3), and
  // init() and load_safetensors() need their `into`.
  GPT(const GPTConfig& cfg, const ModelPart& part, DType dtype, Device device = Device::CPU, Tensor params = {},
      Tensor grads = {}, bool no_buffers = false);
  // The whole model on one rank.
  GPT(const GPTConfig& cfg, DType dtype, Device device = Device::CPU) : GPT(cfg, ModelPart{}, dtype, device) {}
  ~GPT();
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  const GPTConfig& config() const { return cfg_; }  // the whole model's
  const ModelPart& part() const { return part_; }    // its blocks' end resolved
  const TensorSharding& sharding() const { return part_.sharding; }
  bool sequence_parallel() const { return part_.sharding.sp(); }
  int num_blocks() const { return part_.blocks.size(cfg_.n_layer); }
  bool first_stage() const { return part_.blocks.first(); }             // holds the embeddings
  bool last_stage() const { return part_.blocks.last(cfg_.n_layer); }  // holds the final norm and the head
  // The tensor-parallel group (sharding().tp ranks, this one at sharding().rank); required before forward/backward
  // when tp > 1, unused (and never called) when tp == 1. The model communicates only through it.
  void set_tp_comm(Communicator* tp) { tp_ = tp; }
  // The context-parallel group (model/context_parallel.h): with more than one rank, each micro-batch holds this
  // rank's two zigzag chunks of every sequence (T of alloc_activations is the local length, 2 T / cp), positions are
  // global, attention runs around the ring, and the loss sum and parameter gradients are this rank's share (the
  // caller sums them over cp). Set before alloc_activations.
  void set_cp_comm(Communicator* cp) { cp_ = cp; }
  ContextParallel context_parallel() const { return ContextParallel(cp_); }
  int embedding_param() const { return wte_; }  // the token embedding (GPT-2's wte, also its head), -1 if absent
  int vocab_padded() const { return vp_; }                        // Vp, over all tp ranks
  int vocab_shard() const { return vp_ / sharding().tp; }             // Vp / tp rows of wte on this rank
  int vocab_begin() const { return sharding().rank * vocab_shard(); }  // first vocabulary row on this rank
  const ParamTable& table() const { return table_; }
  Tensor params() const { return params_; }  // flat, table().total_numel() elements of the compute dtype
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  Tensor grads() const { return grads_; }    // flat, same layout, acc_dtype(compute dtype); undefined under ZeRO-2
  DType grad_dtype() const { return acc_dtype(dtype_); }
  Tensor param(int i) const;                 // a view of parameter i in the flat parameter buffer, or the view set
  Tensor grad(int i) const;                  // its gradient: in the flat gradient buffer, or the view set for it
  Tensor param(const std::string& name) const;
  // Where each parameter's gradient lives (table order, each of its shape and grad_dtype()) when not in a flat
  // buffer: the backward pass accumulates into these views instead.
  void set_grad_views(std::vector<Tensor> views);
  // Where each parameter lives (table order, each of its shape and the compute dtype) when the passes must read it
  // elsewhere than params() (ZeRO-3: a gathered block's buffer): forward, backward and backward_weights read these
  // views, and only after their params_needed hooks asked for the elements.
  void set_param_views(std::vector<Tensor> views);
  // Called with a parameter's index each time param() gives its view, before anything reads it: ZeRO waits there
  // for the gather of that parameter's bucket (ShardedParams::reader, ParamGather::reader). None when empty.
  void set_param_read_hook(std::function<void(int)> on_read) { on_param_read_ = std::move(on_read); }
  // ZeRO-3's shared ring: some gradient views are their parameters' views, and a backward pass writes each of those
  // gradients over its parameter after the parameter's last read in the pass (kernels::matmul_backward computes the
  // input's gradient first; the norms go through scratch; the embeddings, never read backward, are zeroed first).
  // grad() then calls the read hook too, so that no gather is still writing where the gradient goes.
  void set_grads_over_params(bool on) { grads_over_params_ = on; }
  bool grads_over_params() const { return grads_over_params_; }
  int64_t num_parameters() const;  // unpadded, as GPT-2 counts them (the tied head counted once)

  // GPT-2 initialisation: weights ~ N(0, std^2) (c_proj weights scaled by 1/sqrt(2L)), biases 0, LayerNorm
  // weight 1, vocabulary padding 0. Element g (its global index, ParamSpec::global_index) of parameter p is
  // std * philox_normal(seed, fnv1a64(p's name), g), so each tp rank draws exactly its shard and the full
  // weights do not depend on how parameters are laid out or sharded.
  // `into`, when given, is a flat buffer laid out like params() (any float dtype, e.g. the fp32 masters of a
  // 16-bit model) that receives the weights instead of params().
  void init(uint64_t seed, double std, const Tensor& into = {});
  // Parameter p's initial values alone, into `out` (its numel() elements, any float dtype): ZeRO-3 initialises
  // parameter by parameter, never holding the whole model.
  void init_param(uint64_t seed, double std, int p, const Tensor& out) const;

  // Loads GPT-2 Hugging Face weights (F32/BF16/F16; "transformer." prefix optional; attention-mask buffers
  // and a tied lm_head ignored): the file holds full tensors, and this rank decodes only its shard of each.
  // Throws InputError for a malformed file or missing/unknown/mis-shaped tensors. `into` as in init().
  void load_safetensors(const std::string& path, const Tensor& into = {});
  // Writes every parameter (unpadded, F32) under its GPT-2 name (tp = 1 only: with tp > 1 gather the shards with
  // assemble_full and write them with write_full_safetensors, model/tp_shard.h).
  void export_safetensors(const std::string& path) const;
  // Writes a Hugging Face config.json describing the full model.
  void export_hf_config(const std::string& path) const { write_hf_config(path, cfg_); }
  // Writes the gradient buffer (unpadded, F32) under the parameter names (tp = 1 only, as export_safetensors).
  void export_grads(const std::string& path) const;

  // Allocates one micro-batch's activation record from `arena` (split_backward: also what the zero-bubble
  // weight pass keeps).
  Activations alloc_activations(Arena& arena, int B, int T, bool split_backward = false) const;

  // Takes from `arena` what one backward pass takes first (its scratch, shared by the blocks; backward() calls the
  // same code): the planner counts it on a counting arena (core/arena.h).
  void alloc_backward_scratch(Arena& arena, const Activations& a, bool split) const;
  // What one block's attention allocates for the call beyond its record and scratch (context parallelism's ring;
  // 0 without it), for B sequences of this rank's T tokens: the planner adds it to the passes' peak.
  int64_t attention_temp_bytes(int B, int T) const;

  // Forward pass of one micro-batch over acts.tokens / acts.targets: per-token losses in acts.losses, their
  // sum added to loss_sum[0] (when defined), and, when dloss != 0, acts.logits replaced by
  // dloss * d(sum of losses)/d(logits), ready for backward(). dloss = 1 / (tokens in the global batch) makes
  // the accumulated gradients those of the global batch's mean loss. A stage after the first reads
  // acts.input() instead of tokens; a stage before the last stops at acts.output() (no loss).
  // When given, params_needed(begin) is called before the pass reads parameters of the flat layout's elements
  // [begin, end) it has not read yet (begin falls: before the embedding and the first block's input norm, then
  // before each block, and before the norm fused into its end, which reads the next block's input norm; the last
  // call asks for everything), so ZeRO's parameter all-gather of the previous step can be waited for bucket by
  // bucket, and ZeRO-3 holds no more than two blocks.
  void forward(Activations& acts, double dloss, const Tensor& loss_sum,
               const std::function<void(int64_t)>& params_needed = {}) const;
  // Backward pass: ACCUMULATES parameter gradients into grads() (+=), so micro-batches accumulate for free.
  // Scratch comes from `arena`. When given, grads_ready(end) is called each time the gradients of the flat
  // buffer's elements [0, end) stop changing for this micro-batch (end grows: after the final LayerNorm, after
  // each half of every block, and once more at the very end), so data parallelism can start reducing them.
  // Pipeline stages: a stage before the last starts from `dout` ([Ns, C], d(loss)/d(output) from the next
  // stage) instead of the loss; a stage after the first writes d(loss)/d(input) into `dinput` ([Ns, C]) instead
  // of running the embedding backward. part = InputOnly (zero-bubble B pass) leaves the matmul weight and bias
  // gradients and the embedding's to backward_weights() and calls no grads_ready.
  // When given, params_needed(begin, end) is called before the pass first reads parameters of the flat layout's
  // elements [begin, end): the head's (the final norm, then the head's weight) and then each block's, last block
  // first, so that ZeRO-3 can gather each unit just before it is read.
  void backward(Activations& acts, Arena& arena, const std::function<void(int64_t)>& grads_ready = {},
                BackwardPart part = BackwardPart::All, const Tensor& dout = {}, const Tensor& dinput = {},
                const ParamsNeeded& params_needed = {});
  // The zero-bubble W pass after backward(..., InputOnly): the weight and bias gradients of every matmul and the
  // embedding, accumulated; grads_ready as in backward(). It reads parameters only under train.recompute=light (each
  // block's norms again), and asks params_needed for each block's first.
  void backward_weights(Activations& acts, const std::function<void(int64_t)>& grads_ready = {},
                        const ParamsNeeded& params_needed = {});

 private:
  // The blocks' records under train.recompute: each block its own (none), all blocks one buffer for the norms'
  // outputs and the MLP's activation (light) or for the attention probabilities (selective), or all blocks one set
  // (full).
  void alloc_block_records(Activations& a, Arena& arena) const;
  BlockScratch backward_scratch(Arena& arena, const Activations& a, bool split) const;
  // forward()'s params_needed before the norm that reads block `next`'s input norm weights (fused into block
  // next - 1's end; next = 0: before the embedding), or everything when no block follows.
  void need_params(const std::function<void(int64_t)>& params_needed, int next) const;
  // forward()'s params_needed before block l runs: the rest of its parameters.
  void need_block_params(const std::function<void(int64_t)>& params_needed, int l) const;
  void ready_through(int p, const std::function<void(int64_t)>& grads_ready) const;
  // backward()'s params_needed: parameter p's elements, or stage-local block l's (a contiguous range).
  void backward_needs_param(const ParamsNeeded& params_needed, int p) const;
  void backward_needs_block(const ParamsNeeded& params_needed, int l) const;
  TensorParallel tensor_parallel() const;  // the layers' view of the tp group (checked)
  // The embedding's backward from demb (all N rows): wte's gradient, and wpe's at this rank's positions.
  void embedding_backward(const TensorParallel& tp, const ContextParallel& cp, const Tensor& demb,
                          const Tensor& tokens);

  GPTConfig cfg_;
  ModelPart part_;
  Communicator* tp_ = nullptr;
  Communicator* cp_ = nullptr;
  int vp_;
  DType dtype_;
  Device device_;
  ParamTable table_;
  Tensor params_, grads_;
  std::vector<Tensor> grad_views_;  // per parameter, when set (then grads_ is undefined)
  std::vector<Tensor> param_views_;  // per parameter, when set (then the passes do not read params_)
  std::function<void(int)> on_param_read_;  // set_param_read_hook's
  bool grads_over_params_ = false;           // set_grads_over_params'
  // GPT-2: wte (also the head), wpe. Llama: model.embed_tokens (wte_), the head (lm_head, or the embedding when
  // tied), no wpe.
  int wte_ = -1, wpe_ = -1, head_ = -1;
  std::vector<std::unique_ptr<Block>> blocks_;  // the stage's blocks, stage-local index l
  std::unique_ptr<Norm> final_norm_;            // ln_f (GPT-2), model.norm (Llama): last stage only
};

}  // namespace mt
