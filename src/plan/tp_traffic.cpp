// Tensor-parallel collectives per pass (see tp_traffic.h); tests/test_planner.cpp checks them against the model's
// passes on a CountingCommunicator.
#include "plan/tp_traffic.h"

namespace mt::plan {

TpTraffic tp_traffic(const ModelConfig& m, const StageShape& s) {
  TpTraffic t;
  if (s.tp <= 1) return t;
  const int64_t N = int64_t(s.B) * m.seq_len, C = m.d_model, es = int64_t(dtype_size(s.dtype));
  const int64_t act = N * C * es;  // [N, C] in the compute dtype
  const int64_t f32 = 4;
  const CommKind AR = CommKind::AllReduce, AG = CommKind::AllGather, RS = CommKind::ReduceScatter;
  auto add = [](std::vector<TpOp>& v, CommKind k, int64_t b, int times = 1) {
    for (int i = 0; i < times; ++i) v.push_back({k, b});
  };
  const int L = s.blocks;
  // Llama with fewer kv heads than tp ranks: each block's k and v weight gradients are summed over their copies
  // (LlamaBlock::kv_weight_grads), in the pass that computes them.
  const int kv = m.n_kv_head > 0 ? m.n_kv_head : m.n_head;
  if (m.arch == ModelArch::Llama && kv < s.tp)
    add(s.split ? t.bwd_weight : t.bwd, AR, 2 * int64_t(kv) * (C / m.n_head) * C * f32, L);
  if (!s.sp) {
    if (s.first) add(t.fwd, AR, act);   // vocab-parallel embedding
    add(t.fwd, AR, act, 2 * L);         // g after attention and MLP c_proj
    if (s.last) {
      add(t.fwd, AR, N * f32);          // cross-entropy row max
      add(t.fwd, AR, 2 * N * f32);      // and sums
    }
    std::vector<TpOp>& b = s.split ? t.bwd_input : t.bwd;
    if (s.last) add(b, AR, act);        // the head's input gradient (f's backward)
    add(b, AR, act, 2 * L);             // c_attn's and c_fc's input gradients
    if (s.recompute == Recompute::Full) add(b, AR, act, L);  // the blocks' forward again (attention c_proj)
    return t;
  }
  // Sequence parallelism.
  if (s.first) add(t.fwd, RS, act);
  for (int l = 0; l < L; ++l) {
    add(t.fwd, AG, act);  // ln1 gathered for c_attn
    add(t.fwd, RS, act);  // attention c_proj
    add(t.fwd, AG, act);  // ln2 gathered for c_fc
    add(t.fwd, RS, act);  // MLP c_proj
  }
  if (s.last) {
    add(t.fwd, AG, act);  // lnf gathered for the head
    add(t.fwd, AR, N * f32);
    add(t.fwd, AR, 2 * N * f32);
  }
  std::vector<TpOp>& b = s.split ? t.bwd_input : t.bwd;
  const int64_t ln = (m.arch == ModelArch::Llama ? 1 : 2) * C * f32;  // a norm's partial weight (and bias) gradients
  if (s.last) {
    add(b, AG, act);  // lnf again
    add(b, RS, act);  // the head's input gradient
    add(b, AR, ln);
  }
  for (int l = 0; l < L; ++l) {
    if (s.recompute == Recompute::Full) {  // the block's forward again, as far as the MLP's activation
      add(b, AG, act);
      add(b, RS, act);
      add(b, AG, act);
    }
    add(b, AG, act);  // dres for MLP c_proj
    add(b, AG, act);  // ln2 for c_fc (gathered in the input pass too, split or not)
    add(b, RS, act);
    add(b, AR, ln);
    add(b, AG, act);  // dres for attention c_proj
    add(b, AG, act);  // ln1 for c_attn
    add(b, RS, act);
    add(b, AR, ln);
  }
  if (s.first) add(b, AG, act);  // the embedding backward reads every row
  if (s.split) {  // the weight pass gathers the LayerNorm outputs again
    if (s.last) add(t.bwd_weight, AG, act);
    add(t.bwd_weight, AG, act, 2 * L);
  }
  return t;
}

}  // namespace mt::plan
