// Mirrors of the model's arena allocations (see activation_bytes.h); keep in step with GPT::alloc_activations,
// GPT::backward and PipelineRunner.
#include "plan/activation_bytes.h"

namespace mt::plan {

namespace {
bool seq_parallel(const GPTConfig& g) { return g.tp > 1 && g.sequence_parallel; }
}  // namespace

int64_t record_bytes(const GPTConfig& g, int B, int T, DType dt, bool split) {
  const int64_t N = int64_t(B) * T, Cf = g.d_model, NHl = g.n_head / g.tp, HS = g.head_size();
  const int64_t C = NHl * HS, KV = g.local_kv_heads() * HS, H = g.mlp_hidden() / g.tp;
  const bool sp = seq_parallel(g), llama = g.llama();
  const int64_t Ns = sp ? N / g.tp : N;
  const DType acc = acc_dtype(dt);
  const int L = g.stage_layers();
  int64_t b = 2 * arena_bytes(N, DType::I32);  // tokens, targets
  b += (L + 1) * arena_bytes(Ns * Cf, dt);      // residual stream
  const int64_t att = arena_bytes(int64_t(B) * NHl * T * T, dt);  // attention probabilities
  const int64_t rest = llama ? 3 * arena_bytes(Ns * Cf, dt)      // ln1, res_attn, ln2
                                   + 2 * arena_bytes(Ns, acc)    // their rstd
                                   + arena_bytes(N * C, dt) + 2 * arena_bytes(N * KV, dt)  // q, k, v
                                   + arena_bytes(N * 3 * C, dt)                            // expanded qkv
                                   + arena_bytes(N * C, dt)                                // atty
                                   + 3 * arena_bytes(N * H, dt)                            // gate, up, swiglu
                             : 3 * arena_bytes(Ns * Cf, dt)     // ln1, res_attn, ln2
                                   + 4 * arena_bytes(Ns, acc)   // ln1/ln2 mean and rstd
                                   + arena_bytes(N * 3 * C, dt)  // qkv
                                   + arena_bytes(N * C, dt)      // atty
                                   + 2 * arena_bytes(N * 4 * C, dt);  // fch, fch_gelu
  // The LayerNorms' outputs and the MLP's activation (GELU's, or SwiGLU's product), shared under light.
  const int64_t light = 2 * arena_bytes(Ns * Cf, dt) + arena_bytes(N * (llama ? H : 4 * C), dt);
  // train.recompute: every block its own record, one buffer of the recomputed tensors for all (light: the norms'
  // outputs and the MLP's activation; selective: the attention probabilities), one set (full).
  b += g.recompute == Recompute::Full        ? rest + att
       : g.recompute == Recompute::Selective ? L * rest + (L > 0 ? att : 0)
       : g.recompute == Recompute::Light     ? L * (rest + att) - (L > 0 ? (L - 1) * light : 0)
                                             : L * (rest + att);
  if (g.last_stage()) {
    b += arena_bytes(Ns * Cf, dt) + (llama ? 1 : 2) * arena_bytes(Ns, acc);  // lnf and its statistics
    b += arena_bytes(N * (padded_vocab(g.vocab_size, g.tp) / g.tp), dt);    // logits (this rank's vocabulary slice)
    b += arena_bytes(N, acc);                                             // losses
    if (g.tp > 1) b += arena_bytes(N, acc) + arena_bytes(2 * N, acc);    // vocab-parallel cross-entropy rows
  }
  if (sp) b += arena_bytes(N * Cf, dt);  // sp_full
  if (split) {
    b += L * (llama ? 2 * arena_bytes(N * Cf, dt) + arena_bytes(N * C, dt) + 2 * arena_bytes(N * KV, dt) +
                          2 * arena_bytes(N * H, dt)
                    : 2 * arena_bytes(N * Cf, dt) + arena_bytes(N * 4 * C, dt) + arena_bytes(N * 3 * C, dt));
    if (g.first_stage()) b += arena_bytes(N * Cf, dt);  // demb
  }
  if (!g.first_stage()) b += arena_bytes(Ns * Cf, dt);  // dinput, sent to the previous stage
  return b;
}

int64_t backward_scratch_bytes(const GPTConfig& g, int B, int T, DType dt, bool split) {
  const int64_t N = int64_t(B) * T, C = g.d_model, NHl = g.n_head / g.tp, Cl = NHl * g.head_size();
  const bool tp = g.tp > 1, sp = seq_parallel(g);
  const int64_t Ns = sp ? N / g.tp : N;
  const DType acc = acc_dtype(dt);
  int64_t b = 2 * arena_bytes(Ns * C, dt);  // dres, dln
  if (sp) b += 2 * arena_bytes(N * C, dt);  // dln_full, dres_full
  const int64_t datt = arena_bytes(g.stage_layers() > 0 ? int64_t(B) * NHl * T * T : 1, acc);  // fp32 scratch
  if (g.llama()) {
    const int64_t KV = g.local_kv_heads() * g.head_size(), H = g.mlp_hidden() / g.tp;
    b += arena_bytes(N * C, dt) + arena_bytes(N * Cl, dt) + arena_bytes(N * 3 * Cl, dt) + arena_bytes(N * H, dt);
    // dx_part, datty, dqkv (expanded), dswiglu
    if (!split) b += arena_bytes(N * Cl, dt) + 2 * arena_bytes(N * KV, dt) + 2 * arena_bytes(N * H, dt);
    return b + datt + (sp ? arena_bytes(C, acc) : 0);  // the RMSNorm weight's partial gradient (sp)
  }
  if (tp) b += arena_bytes(N * Cl, dt);     // datty
  if (!split) b += arena_bytes(N * 3 * Cl, dt) + arena_bytes(N * 4 * Cl, dt);  // dqkv, dfch
  b += datt;
  if (sp) b += arena_bytes(2 * C, acc);  // ln_grads
  return b;
}

int64_t recv_buffer_bytes(const GPTConfig& g, int B, int T, DType dt) {
  const int64_t N = int64_t(B) * T, rows = seq_parallel(g) ? N / g.tp : N;
  return arena_bytes(rows * g.d_model, dt);
}

}  // namespace mt::plan
