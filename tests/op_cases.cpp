// The op registry's cases (op_registry.h): each kernel entry point of src/kernels/*.h, forward and backward, in the
// dtypes its header lists, made at any size by the makers below; op_cases() makes them at odd and tiny sizes (rows
// 1, 5, 37; widths not multiples of 8 or 16 where the kernel allows). Outputs the op overwrites start as NaN
// (OpRun::act_out); outputs it accumulates into start from random values, so both the = and the += contracts are
// compared.
#include <string>

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/attention_block.h"
#include "kernels/crossentropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gelu.h"
#include "kernels/gqa.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/sgd.h"
#include "kernels/swiglu.h"
#include "kernels/vocab_parallel.h"
#include "op_registry.h"

namespace mt::test {
using namespace mt::kernels;

namespace {
const std::vector<DType> kHalf = {DType::BF16, DType::F16};
std::string dims(std::initializer_list<std::pair<const char*, int64_t>> d) {
  std::string s;
  for (const auto& [name, v] : d) s += (s.empty() ? "" : " ") + std::string(name) + " " + std::to_string(v);
  return s;
}
}  // namespace

OpCase matmul_case(int64_t N, int64_t C, int64_t OC, bool out_in, bool bias) {
  const WeightLayout layout = out_in ? WeightLayout::OutIn : WeightLayout::InOut;
  return {{"matmul_forward", "matmul_backward"},
          dims({{"N", N}, {"C", C}, {"OC", OC}}) + (out_in ? " OutIn" : " InOut") + (bias ? " bias" : ""),
          kHalf, true, &kReduction, [=](const OpRun& r) {
            const Shape ws = out_in ? Shape{OC, C} : Shape{C, OC};
            Tensor inp = r.act_random({N, C}, 1), w = r.act_random(ws, 2, 0.2);
            Tensor b = bias ? r.act_random({OC}, 3) : Tensor(), out = r.act_out({N, OC});
            Tensor dout = r.act_random({N, OC}, 4), dinp = r.act_out({N, C});
            Tensor dw = r.acc_random(ws, 5), db = bias ? r.acc_random({OC}, 6) : Tensor();
            return [=] {
              matmul_forward(out, inp, w, b, layout);
              matmul_backward(dinp, dw, db, dout, inp, w, layout);
              OpOutputs o{{"out", out}, {"dinp", dinp}, {"dweight", dw}};
              if (bias) o.push_back({"dbias", db});
              return o;
            };
          }};
}

OpCase matmul_gelu_case(int64_t N, int64_t C, int64_t OC) {
  return {{"matmul_bias_gelu_forward"}, dims({{"N", N}, {"C", C}, {"OC", OC}}), kHalf, true, &kReduction,
          [=](const OpRun& r) {
            Tensor inp = r.act_random({N, C}, 1), w = r.act_random({C, OC}, 2, 0.2), b = r.act_random({OC}, 3);
            Tensor pre = r.act_out({N, OC}), out = r.act_out({N, OC});
            return [=] {
              matmul_bias_gelu_forward(pre, out, inp, w, b);
              return OpOutputs{{"pre", pre}, {"out", out}};
            };
          }};
}

OpCase attention_case(int64_t B, int64_t T, int64_t NH, int64_t HS) {
  return {{"attention_forward", "attention_backward"}, dims({{"B", B}, {"T", T}, {"NH", NH}, {"HS", HS}}), kHalf,
          true, &kAttention, [=](const OpRun& r) {
            const int64_t C = NH * HS;
            Tensor qkv = r.act_random({B, T, 3 * C}, 1), out = r.act_out({B, T, C});
            const Shape rec = attention_record_shape(r.device(), B, NH, T);
            Tensor att = Tensor::empty(rec, attention_record_dtype(r.device(), r.act()), r.device());
            Tensor datt = Tensor::empty(rec, r.acc(), r.device());
            Tensor dout = r.act_random({B, T, C}, 2), dqkv = r.act_out({B, T, 3 * C});
            return [=] {
              attention_forward(out, att, qkv, int(NH));
              attention_backward(dqkv, datt, dout, qkv, out, att, int(NH));
              return OpOutputs{{"out", out}, {"dqkv", dqkv}};
            };
          }};
}

// Two key chunks of one query chunk: the diagonal (causal) block and an earlier (full) one, merged, then both
// blocks' backward into the same gradients.
OpCase attention_block_case(int64_t B, int64_t T, int64_t NH, int64_t KV, int64_t HS) {
  return {{"attention_block_forward", "attention_block_merge", "attention_block_backward"},
          dims({{"B", B}, {"T", T}, {"NH", NH}, {"KV", KV}, {"HS", HS}}) + ", causal + full blocks", kHalf, true,
          &kAttention, [=](const OpRun& r) {
            const Shape qs{B, T, NH * HS}, ks{B, T, KV * HS};
            Tensor q = r.act_random(qs, 1), k0 = r.act_random(ks, 2), v0 = r.act_random(ks, 3);
            Tensor k1 = r.act_random(ks, 4), v1 = r.act_random(ks, 5);
            Tensor out = r.acc_out(qs), lse = r.acc_out({B, NH, T}), out_b = r.acc_out(qs), lse_b = r.acc_out({B, NH, T});
            Tensor out_s = Tensor::empty(qs, r.act(), r.device()), dout = r.act_random(qs, 6), dq = r.acc_random(qs, 7);
            Tensor dk0 = r.acc_random(ks, 8), dv0 = r.acc_random(ks, 9), dk1 = r.acc_random(ks, 10);
            Tensor dv1 = r.acc_random(ks, 11);
            return [=] {
              const int nh = int(NH), kv = int(KV);
              attention_block_forward(out, lse, q, k1, v1, nh, kv, BlockMask::Causal);
              attention_block_forward(out_b, lse_b, q, k0, v0, nh, kv, BlockMask::Full);
              attention_block_merge(out, lse, out_b, lse_b, nh);
              copy_convert(out_s, out);  // the merged output, rounded once
              attention_block_backward(dq, dk1, dv1, dout, out_s, lse, q, k1, v1, nh, kv, BlockMask::Causal);
              attention_block_backward(dq, dk0, dv0, dout, out_s, lse, q, k0, v0, nh, kv, BlockMask::Full);
              return OpOutputs{{"out", out}, {"lse", lse}, {"dq", dq}, {"dk0", dk0}, {"dv0", dv0},
                               {"dk1", dk1}, {"dv1", dv1}};
            };
          }};
}

OpCase gqa_expand_case(int64_t N, int64_t NH, int64_t KV, int64_t HS) {
  return {{"gqa_expand"}, dims({{"N", N}, {"NH", NH}, {"KV", KV}, {"HS", HS}}), kHalf, true, &kExact,
          [=](const OpRun& r) {
            Tensor q = r.act_random({N, NH * HS}, 1), k = r.act_random({N, KV * HS}, 2);
            Tensor v = r.act_random({N, KV * HS}, 3), full = r.act_out({N, 3 * NH * HS});
            return [=] {
              gqa_expand(full, q, k, v, int(NH), int(KV), int(HS));
              return OpOutputs{{"qkv_full", full}};
            };
          }};
}

// Each kv head's gradient sums NH / KV values, rounded once: an elementwise bound.
OpCase gqa_reduce_case(int64_t N, int64_t NH, int64_t KV, int64_t HS) {
  return {{"gqa_reduce"}, dims({{"N", N}, {"NH", NH}, {"KV", KV}, {"HS", HS}}), kHalf, true, &kElementwise,
          [=](const OpRun& r) {
            Tensor full = r.act_random({N, 3 * NH * HS}, 1), dq = r.act_out({N, NH * HS});
            Tensor dk = r.act_out({N, KV * HS}), dv = r.act_out({N, KV * HS});
            return [=] {
              gqa_reduce(dq, dk, dv, full, int(NH), int(KV), int(HS));
              return OpOutputs{{"dq", dq}, {"dk", dk}, {"dv", dv}};
            };
          }};
}

OpCase layernorm_case(int64_t N, int64_t C) {
  return {{"layernorm_forward", "layernorm_backward"}, dims({{"N", N}, {"C", C}}), kHalf, true, &kReduction,
          [=](const OpRun& r) {
            Tensor inp = r.act_random({N, C}, 1, 1.0, 2.0), w = r.act_random({C}, 2, 0.2, 1.0), b = r.act_random({C}, 3);
            Tensor out = r.act_out({N, C}), mean = r.acc_out({N}), rstd = r.acc_out({N});
            Tensor dout = r.act_random({N, C}, 5), dinp = r.act_random({N, C}, 6);
            Tensor dw = r.acc_random({C}, 7), db = r.acc_random({C}, 8);
            return [=] {
              layernorm_forward(out, mean, rstd, inp, w, b);
              layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd);
              return OpOutputs{{"out", out}, {"mean", mean}, {"rstd", rstd}, {"dinp", dinp}, {"dweight", dw},
                               {"dbias", db}};
            };
          }};
}

// The residual add fused with the next LayerNorm (its backward is layernorm_backward's plus the skip's identity).
OpCase residual_layernorm_case(int64_t N, int64_t C) {
  return {{"residual_layernorm_forward"}, dims({{"N", N}, {"C", C}}), kHalf, true, &kReduction,
          [=](const OpRun& r) {
            Tensor a = r.act_random({N, C}, 1, 1.0, 2.0), skip = r.act_random({N, C}, 2), b = r.act_random({C}, 3);
            Tensor w = r.act_random({C}, 4, 0.2, 1.0), res = r.act_out({N, C}), out = r.act_out({N, C});
            Tensor mean = r.acc_out({N}), rstd = r.acc_out({N});
            return [=] {
              residual_layernorm_forward(res, out, mean, rstd, a, skip, w, b);
              return OpOutputs{{"residual", res}, {"out", out}, {"mean", mean}, {"rstd", rstd}};
            };
          }};
}

OpCase rmsnorm_case(int64_t N, int64_t C) {
  return {{"rmsnorm_forward", "rmsnorm_backward"}, dims({{"N", N}, {"C", C}}), kHalf, true, &kReduction,
          [=](const OpRun& r) {
            Tensor inp = r.act_random({N, C}, 1), w = r.act_random({C}, 2, 0.2, 1.0);
            Tensor out = r.act_out({N, C}), rstd = r.acc_out({N});
            Tensor dout = r.act_random({N, C}, 3), dinp = r.act_random({N, C}, 4), dw = r.acc_random({C}, 5);
            return [=] {
              rmsnorm_forward(out, rstd, inp, w, 1e-5);
              rmsnorm_backward(dinp, dw, dout, inp, w, rstd);
              return OpOutputs{{"out", out}, {"rstd", rstd}, {"dinp", dinp}, {"dweight", dw}};
            };
          }};
}

OpCase gelu_case(int64_t N, int64_t C) {
  return {{"gelu_forward", "gelu_backward"}, dims({{"N", N}, {"C", C}}), kHalf, true, &kElementwise,
          [=](const OpRun& r) {
            Tensor inp = r.act_random({N, C}, 1, 2.0), out = r.act_out({N, C});
            Tensor dout = r.act_random({N, C}, 2), dinp = r.act_out({N, C});
            return [=] {
              gelu_forward(out, inp);
              gelu_backward(dinp, inp, dout);
              return OpOutputs{{"out", out}, {"dinp", dinp}};
            };
          }};
}

OpCase swiglu_case(int64_t N, int64_t C) {
  return {{"swiglu_forward", "swiglu_backward"}, dims({{"N", N}, {"C", C}}), kHalf, true, &kElementwise,
          [=](const OpRun& r) {
            Tensor gate = r.act_random({N, C}, 1, 2.0), up = r.act_random({N, C}, 2), out = r.act_out({N, C});
            Tensor dout = r.act_random({N, C}, 3), dgate = r.act_out({N, C}), dup = r.act_out({N, C});
            return [=] {
              swiglu_forward(out, gate, up);
              swiglu_backward(dgate, dup, dout, gate, up);
              return OpOutputs{{"out", out}, {"dgate", dgate}, {"dup", dup}};
            };
          }};
}

// The q and k columns of a fused qkv row rotate; v's stay. Positions start at 5 (a continuation).
OpCase rope_case(int64_t B, int64_t T, int64_t NH, int64_t HS) {
  return {{"rope_forward", "rope_backward"}, dims({{"B", B}, {"T", T}, {"NH", NH}, {"HS", HS}}) + ", from position 5",
          kHalf, true, &kElementwise, [=](const OpRun& r) {
            const int64_t W = 3 * NH * HS;
            Tensor x = r.act_random({B, T, W}, 1), dx = r.act_random({B, T, W}, 2);
            return [=] {
              rope_forward(x, T, HS, kRopeTheta, 0, 2 * NH * HS, 5);
              rope_backward(dx, T, HS, kRopeTheta, 0, 2 * NH * HS, 5);
              return OpOutputs{{"x", x}, {"dx", dx}};
            };
          }};
}

OpCase add_case(int64_t N, int64_t C) {
  return {{"add_forward", "bias_add"}, dims({{"N", N}, {"C", C}}), kHalf, true, &kElementwise, [=](const OpRun& r) {
            Tensor a = r.act_random({N, C}, 1), b = r.act_random({N, C}, 2), out = r.act_out({N, C});
            Tensor y = r.act_random({N, C}, 3), bias = r.act_random({C}, 4);
            return [=] {
              add_forward(out, a, b);
              bias_add(y, bias);
              return OpOutputs{{"add", out}, {"bias_add", y}};
            };
          }};
}

// dst += src with dst in the activation dtype (the residual stream's gradient) or, into_acc, in the accumulation
// dtype (a 16-bit gradient into an fp32 one).
OpCase accumulate_case(int64_t N, int64_t C, bool into_acc) {
  return {{"accumulate"}, dims({{"N", N}, {"C", C}}) + (into_acc ? " into the accumulation dtype" : ""), kHalf, true,
          &kElementwise, [=](const OpRun& r) {
            Tensor src = r.act_random({N, C}, 1), dst = into_acc ? r.acc_random({N, C}, 2) : r.act_random({N, C}, 2);
            return [=] {
              accumulate(dst, src);
              return OpOutputs{{"dst", dst}};
            };
          }};
}

OpCase divide_case(int64_t N, int64_t C) {
  OpCase c{{"divide_"}, dims({{"N", N}, {"C", C}}) + " / 3", kHalf, true, &kElementwise, [=](const OpRun& r) {
             Tensor t = r.act_random({N, C}, 1);
             return [=] {
               divide_(t, 3);
               return OpOutputs{{"t", t}};
             };
           }};
  c.fp64 = false;  // fp32, bf16 and fp16 (a collective's Avg)
  return c;
}

// The whole padded vocabulary with positions, or (slice) rows [Vp/2, Vp) of it as one tensor-parallel rank holds
// them, without.
OpCase embedding_case(int64_t B, int64_t T, int64_t C, int64_t Vp, int64_t vocab, bool slice) {
  return {{"embedding_forward", "embedding_backward"},
          dims({{"B", B}, {"T", T}, {"C", C}, {"Vp", Vp}}) + (slice ? ", rows [Vp/2, Vp)" : ""), kHalf, true,
          &kReduction, [=](const OpRun& r) {
            const int64_t v0 = slice ? Vp / 2 : 0, rows = Vp - v0;
            Tensor tok = r.ints({B, T}, 1, 0, vocab), wte = r.act_random({rows, C}, 2);
            Tensor wpe = slice ? Tensor() : r.act_random({T, C}, 3), out = r.act_out({B, T, C});
            Tensor dout = r.act_random({B, T, C}, 4), dwte = r.acc_random({rows, C}, 5);
            Tensor dwpe = slice ? Tensor() : r.acc_random({T, C}, 6);
            return [=] {
              embedding_forward(out, tok, wte, wpe, v0, slice ? Vp : -1);
              embedding_backward(dwte, dwpe, dout, tok, v0, slice ? Vp : -1);
              OpOutputs o{{"out", out}, {"dwte", dwte}};
              if (!slice) o.push_back({"dwpe", dwpe});
              return o;
            };
          }};
}

OpCase xent_case(int64_t N, int64_t Vp, int64_t vocab) {
  return {{"softmax_xent_forward_backward"}, dims({{"N", N}, {"vocab", vocab}, {"Vp", Vp}}), kHalf, true,
          &kReduction, [=](const OpRun& r) {
            Tensor logits = r.act_random({N, Vp}, 1, 3.0), tgt = r.ints({N}, 2, 0, vocab);
            Tensor losses = r.acc_out({N}), dlogits = r.act_out({N, Vp});
            return [=] {
              softmax_xent_forward_backward(losses, dlogits, logits, tgt, vocab, 1.0 / double(N));
              return OpOutputs{{"losses", losses}, {"dlogits", dlogits}};
            };
          }};
}

// One rank's columns [v0, v0 + Vl) of the padded vocabulary; the global reductions between the steps are the
// identity (tp = 1 as far as these kernels know).
OpCase vocab_parallel_xent_case(int64_t N, int64_t Vl, int64_t v0, int64_t vocab) {
  return {{"vocab_parallel_xent_local_max", "vocab_parallel_xent_local_sums", "vocab_parallel_xent_finish"},
          dims({{"N", N}, {"Vl", Vl}, {"v0", v0}, {"vocab", vocab}}), kHalf, true, &kReduction, [=](const OpRun& r) {
            Tensor logits = r.act_random({N, Vl}, 1, 3.0), tgt = r.ints({N}, 2, 0, vocab);
            Tensor row_max = r.acc_out({N}), stats = r.acc_out({2, N}), losses = r.acc_out({N});
            Tensor dlogits = r.act_out({N, Vl});
            return [=] {
              vocab_parallel_xent_local_max(row_max, logits, v0, vocab);
              vocab_parallel_xent_local_sums(stats, logits, tgt, row_max, v0, vocab);
              vocab_parallel_xent_finish(losses, dlogits, logits, tgt, row_max, stats, v0, vocab, 1.0 / double(N));
              return OpOutputs{{"row_max", row_max}, {"stats", stats}, {"losses", losses}, {"dlogits", dlogits}};
            };
          }};
}

OpCase sum_case(int64_t n, bool squares) {
  return {{squares ? "sum_squares_accumulate" : "sum_accumulate"}, dims({{"n", n}}), kHalf, true, &kReduction,
          [=](const OpRun& r) {
            Tensor x = r.act_random({n}, 1), acc = r.acc_random({1}, 2, 0.0, 4.0);
            return [=] {
              if (squares) sum_squares_accumulate(acc, x);
              else sum_accumulate(acc, x);
              return OpOutputs{{"acc", acc}};
            };
          }};
}

// The gradient norm 2 = sqrt(4) over 1 (clipped) and over 4 (not), with a loss scale of 2.
OpCase clip_scale_case() {
  return {{"clip_scale"}, "norm 2, max 1 and 4, loss scale 2", {}, true, &kElementwise, [=](const OpRun& r) {
            Tensor sq = r.acc_random({1}, 1, 0.0, 16.0), s1 = r.acc_out({1}), n1 = r.acc_out({1});
            Tensor s4 = r.acc_out({1}), n4 = r.acc_out({1});
            return [=] {
              clip_scale(s1, n1, sq, 1.0, 0.5);
              clip_scale(s4, n4, sq, 4.0, 0.5);
              return OpOutputs{{"scale_clipped", s1}, {"norm", n1}, {"scale", s4}, {"norm_again", n4}};
            };
          }};
}

// The optimizers keep fp32 (or fp64) state. Several steps read back the state each step leaves. AdamW's 16-bit runs
// also write the rounded compute copy (a mixed-precision step's weights), compared with the fp32 run's params.
OpCase adamw_case(int64_t n, int steps) {
  return {{"adamw_update"}, dims({{"n", n}, {"steps", steps}}), kHalf, true, &kElementwise, [=](const OpRun& r) {
            Tensor p = r.acc_random({n}, 1), g = r.acc_random({n}, 2), m = r.acc_random({n}, 3, 0.01);
            Tensor v = r.acc_random({n}, 4, 1e-4, 1e-3), gs = r.acc_random({1}, 5, 0.0, 0.5);
            Tensor rounded = r.act() == r.acc() ? Tensor() : r.act_out({n});
            return [=] {
              AdamWHyper h;
              h.weight_decay = 0.1;
              for (h.step = 1; h.step <= steps; ++h.step) adamw_update(p, g, m, v, gs, h, rounded);
              return OpOutputs{{"params", p}, {"m", m}, {"v", v}, {"compute copy", rounded.defined() ? rounded : p}};
            };
          }};
}

OpCase sgd_case(int64_t n, int steps) {
  return {{"sgd_update"}, dims({{"n", n}, {"steps", steps}}), {}, true, &kElementwise, [=](const OpRun& r) {
            Tensor p = r.acc_random({n}, 1), g = r.acc_random({n}, 2), buf = r.acc_random({n}, 3);
            Tensor gs = r.acc_random({1}, 4, 0.0, 0.5);
            return [=] {
              SGDHyper h;
              h.lr = 0.1, h.weight_decay = 0.1;
              for (int s = 0; s < steps; ++s) sgd_update(p, g, buf, gs, h);
              return OpOutputs{{"params", p}, {"buf", buf}};
            };
          }};
}

OpCase outer_nesterov_case(int64_t n, int steps) {
  return {{"outer_nesterov_update"}, dims({{"n", n}, {"steps", steps}}), {}, true, &kElementwise,
          [=](const OpRun& r) {
            Tensor anchor = r.acc_random({n}, 1), vel = r.acc_random({n}, 2), x = r.acc_random({n}, 3);
            return [=] {
              for (int s = 0; s < steps; ++s) outer_nesterov_update(anchor, vel, x, 0.7, 0.9);
              return OpOutputs{{"anchor", anchor}, {"velocity", vel}, {"x", x}};
            };
          }};
}

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = {
      matmul_case(1, 1, 1, false, true),
      matmul_case(5, 3, 7, true, false),
      matmul_case(37, 72, 200, false, true),
      matmul_case(64, 96, 320, true, true),
      matmul_gelu_case(37, 72, 200),  // 16-bit with OC % 8 == 0: the GPU's fused epilogue
      attention_case(2, 33, 2, 16),   // head size 16: the GPU kernels take multiples of 16
      attention_block_case(2, 17, 4, 2, 16),
      gqa_expand_case(14, 4, 2, 8),
      gqa_reduce_case(14, 4, 2, 8),
      layernorm_case(37, 72),
      residual_layernorm_case(37, 72),
      rmsnorm_case(37, 72),
      gelu_case(37, 72),
      swiglu_case(37, 72),
      rope_case(2, 9, 2, 8),
      add_case(37, 72),
      accumulate_case(37, 72, false),
      accumulate_case(37, 72, true),
      divide_case(37, 72),
      embedding_case(2, 19, 24, 128, 101, false),
      embedding_case(2, 19, 24, 128, 101, true),
      xent_case(37, 128, 101),
      vocab_parallel_xent_case(37, 64, 64, 101),  // the slice holding vocab 101's last 37 ids and 27 padding
      sum_case(2664, false),
      sum_case(2664, true),
      clip_scale_case(),
      adamw_case(1001, 3),
      sgd_case(1001, 3),
      outer_nesterov_case(1001, 3),
  };
  return cases;
}

}  // namespace mt::test
