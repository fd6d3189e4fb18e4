// Mirrors of the model's arena allocations (see activation_bytes.h); keep in step with GPT::alloc_activations,
// GPT::backward and PipelineRunner.
#include "plan/activation_bytes.h"

namespace mt::plan {

namespace {
bool seq_parallel(const GPTConfig& g) { return g.tp > 1 && g.sequence_parallel; }
}  // namespace

int64_t record_bytes(const GPTConfig& g, int B, int T, DType dt, bool split) {
  const int64_t N = int64_t(B) * T, C = g.d_model / g.tp, NH = g.n_head / g.tp, Cf = g.d_model;
  const bool sp = seq_parallel(g);
  const int64_t Ns = sp ? N / g.tp : N;
  const DType acc = acc_dtype(dt);
  const int L = g.stage_layers();
  int64_t b = 2 * arena_bytes(N, DType::I32);  // tokens, targets
  b += (L + 1) * arena_bytes(Ns * Cf, dt);      // residual stream
  const int64_t layer = 3 * arena_bytes(Ns * Cf, dt)   // ln1, res_attn, ln2
                        + 4 * arena_bytes(Ns, acc)     // ln1/ln2 mean and rstd
                        + arena_bytes(N * 3 * C, dt)   // qkv
                        + arena_bytes(int64_t(B) * NH * T * T, dt)  // attention probabilities
                        + arena_bytes(N * C, dt)                    // atty
                        + 2 * arena_bytes(N * 4 * C, dt);           // fch, fch_gelu
  b += L * layer;
  if (g.last_stage()) {
    b += arena_bytes(Ns * Cf, dt) + 2 * arena_bytes(Ns, acc);          // lnf and its statistics
    b += arena_bytes(N * (padded_vocab(g.vocab_size, g.tp) / g.tp), dt);  // logits (this rank's vocabulary slice)
    b += arena_bytes(N, acc);                                           // losses
    if (g.tp > 1) b += arena_bytes(N, acc) + arena_bytes(2 * N, acc);  // vocab-parallel cross-entropy rows
  }
  if (sp) b += arena_bytes(N * Cf, dt);  // sp_full
  if (split) {
    b += L * (2 * arena_bytes(N * Cf, dt) + arena_bytes(N * 4 * C, dt) + arena_bytes(N * 3 * C, dt));
    if (g.first_stage()) b += arena_bytes(N * Cf, dt);  // demb
  }
  if (!g.first_stage()) b += arena_bytes(Ns * Cf, dt);  // dinput, sent to the previous stage
  return b;
}

int64_t backward_scratch_bytes(const GPTConfig& g, int B, int T, DType dt, bool split) {
  const int64_t N = int64_t(B) * T, C = g.d_model, Cl = C / g.tp, NHl = g.n_head / g.tp;
  const bool tp = g.tp > 1, sp = seq_parallel(g);
  const int64_t Ns = sp ? N / g.tp : N;
  const DType acc = acc_dtype(dt);
  int64_t b = 2 * arena_bytes(Ns * C, dt);  // dres, dln
  if (sp) b += 2 * arena_bytes(N * C, dt);  // dln_full, dres_full
  if (tp) b += arena_bytes(N * Cl, dt);     // datty
  if (!split) b += arena_bytes(N * 3 * Cl, dt) + arena_bytes(N * 4 * Cl, dt);  // dqkv, dfch
  b += arena_bytes(g.stage_layers() > 0 ? int64_t(B) * NHl * T * T : 1, acc);  // datt (fp32 scratch)
  if (sp) b += arena_bytes(2 * C, acc);                                       // ln_grads
  return b;
}

int64_t recv_buffer_bytes(const GPTConfig& g, int B, int T, DType dt) {
  const int64_t N = int64_t(B) * T, rows = seq_parallel(g) ? N / g.tp : N;
  return arena_bytes(rows * g.d_model, dt);
}

}  // namespace mt::plan
