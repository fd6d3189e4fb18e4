// The op registry's cases (op_registry.h): each kernel entry point of src/kernels/*.h, run forward and backward at
// odd and tiny shapes (rows 1, 5, 37; widths not multiples of 8 or 16 where the kernel allows), in the dtypes its
// header lists. Outputs the op overwrites start as NaN (OpRun::act_out); outputs it accumulates into start from
// random values, so both the = and the += contracts are compared.
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
namespace {
using namespace mt::kernels;
const std::vector<DType> kHalf = {DType::BF16, DType::F16};

void matmul_cases(std::vector<OpCase>& c) {
  struct S {
    int64_t N, C, OC;
    WeightLayout layout;
    bool bias;
  };
  for (S s : {S{1, 1, 1, WeightLayout::InOut, true}, S{5, 3, 7, WeightLayout::OutIn, false},
              S{37, 72, 200, WeightLayout::InOut, true}, S{64, 96, 320, WeightLayout::OutIn, true}}) {
    c.push_back({{"matmul_forward", "matmul_backward"},
                 "N " + std::to_string(s.N) + " C " + std::to_string(s.C) + " OC " + std::to_string(s.OC) +
                     (s.layout == WeightLayout::InOut ? " InOut" : " OutIn") + (s.bias ? " bias" : ""),
                 kHalf, true, true, &kReduction, [s](const OpRun& r) {
                   const Shape ws = s.layout == WeightLayout::InOut ? Shape{s.C, s.OC} : Shape{s.OC, s.C};
                   Tensor inp = r.act_random({s.N, s.C}, 1), w = r.act_random(ws, 2, 0.2);
                   Tensor b = s.bias ? r.act_random({s.OC}, 3) : Tensor(), out = r.act_out({s.N, s.OC});
                   matmul_forward(out, inp, w, b, s.layout);
                   Tensor dout = r.act_random({s.N, s.OC}, 4), dinp = r.act_out({s.N, s.C});
                   Tensor dw = r.acc_random(ws, 5), db = s.bias ? r.acc_random({s.OC}, 6) : Tensor();
                   matmul_backward(dinp, dw, db, dout, inp, w, s.layout);
                   OpOutputs o{{"out", out}, {"dinp", dinp}, {"dweight", dw}};
                   if (s.bias) o.push_back({"dbias", db});
                   return o;
                 }});
  }
  c.push_back({{"matmul_bias_gelu_forward"}, "N 37 C 72 OC 200 (the GPU's fused epilogue in 16 bits)", kHalf, true,
               true, &kReduction, [](const OpRun& r) {
                 Tensor inp = r.act_random({37, 72}, 1), w = r.act_random({72, 200}, 2, 0.2);
                 Tensor b = r.act_random({200}, 3), pre = r.act_out({37, 200}), out = r.act_out({37, 200});
                 matmul_bias_gelu_forward(pre, out, inp, w, b);
                 return OpOutputs{{"pre", pre}, {"out", out}};
               }});
}

void attention_cases(std::vector<OpCase>& c) {
  // Head size 16: the GPU kernels take multiples of 16.
  c.push_back({{"attention_forward", "attention_backward"}, "B 2 T 33 NH 2 HS 16", kHalf, true, true, &kAttention,
               [](const OpRun& r) {
                 const int64_t B = 2, T = 33, NH = 2, C = 32;
                 Tensor qkv = r.act_random({B, T, 3 * C}, 1), out = r.act_out({B, T, C});
                 const Shape rec = attention_record_shape(r.device(), B, NH, T);
                 Tensor att = Tensor::empty(rec, r.act(), r.device()), datt = Tensor::empty(rec, r.acc(), r.device());
                 attention_forward(out, att, qkv, int(NH));
                 Tensor dout = r.act_random({B, T, C}, 2), dqkv = r.act_out({B, T, 3 * C});
                 attention_backward(dqkv, datt, dout, qkv, out, att, int(NH));
                 return OpOutputs{{"out", out}, {"dqkv", dqkv}};
               }});
  // Two key chunks of one query chunk: the diagonal (causal) block and an earlier (full) one, merged, then both
  // blocks' backward into the same gradients. Grouped-query: 4 query heads on 2 kv heads.
  c.push_back({{"attention_block_forward", "attention_block_merge", "attention_block_backward"},
               "B 2 T 17 NH 4 KV 2 HS 16, causal + full blocks", kHalf, true, true, &kAttention,
               [](const OpRun& r) {
                 const int64_t B = 2, T = 17, NH = 4, KV = 2, HS = 16;
                 Tensor q = r.act_random({B, T, NH * HS}, 1);
                 Tensor k0 = r.act_random({B, T, KV * HS}, 2), v0 = r.act_random({B, T, KV * HS}, 3);
                 Tensor k1 = r.act_random({B, T, KV * HS}, 4), v1 = r.act_random({B, T, KV * HS}, 5);
                 Tensor out = r.acc_out({B, T, NH * HS}), lse = r.acc_out({B, NH, T});
                 Tensor out_b = r.acc_out({B, T, NH * HS}), lse_b = r.acc_out({B, NH, T});
                 attention_block_forward(out, lse, q, k1, v1, int(NH), int(KV), BlockMask::Causal);
                 attention_block_forward(out_b, lse_b, q, k0, v0, int(NH), int(KV), BlockMask::Full);
                 attention_block_merge(out, lse, out_b, lse_b, int(NH));
                 Tensor out_s = Tensor::empty(out.shape(), r.act(), r.device());  // the merged output, rounded once
                 copy_convert(out_s, out);
                 Tensor dout = r.act_random({B, T, NH * HS}, 6), dq = r.acc_random({B, T, NH * HS}, 7);
                 Tensor dk0 = r.acc_random({B, T, KV * HS}, 8), dv0 = r.acc_random({B, T, KV * HS}, 9);
                 Tensor dk1 = r.acc_random({B, T, KV * HS}, 10), dv1 = r.acc_random({B, T, KV * HS}, 11);
                 attention_block_backward(dq, dk1, dv1, dout, out_s, lse, q, k1, v1, int(NH), int(KV),
                                          BlockMask::Causal);
                 attention_block_backward(dq, dk0, dv0, dout, out_s, lse, q, k0, v0, int(NH), int(KV),
                                          BlockMask::Full);
                 return OpOutputs{{"out", out}, {"lse", lse}, {"dq", dq}, {"dk0", dk0}, {"dv0", dv0},
                                  {"dk1", dk1}, {"dv1", dv1}};
               }});
  c.push_back({{"gqa_expand"}, "N 14 NH 4 KV 2 HS 8", kHalf, true, true, &kExact, [](const OpRun& r) {
                 Tensor q = r.act_random({2, 7, 32}, 1), k = r.act_random({2, 7, 16}, 2), v = r.act_random({2, 7, 16}, 3);
                 Tensor full = r.act_out({2, 7, 96});
                 gqa_expand(full, q, k, v, 4, 2, 8);
                 return OpOutputs{{"qkv_full", full}};
               }});
  c.push_back({{"gqa_reduce"}, "N 14 NH 4 KV 2 HS 8", kHalf, true, true, &kElementwise, [](const OpRun& r) {
                 Tensor full = r.act_random({2, 7, 96}, 1), dq = r.act_out({2, 7, 32});
                 Tensor dk = r.act_out({2, 7, 16}), dv = r.act_out({2, 7, 16});
                 gqa_reduce(dq, dk, dv, full, 4, 2, 8);
                 return OpOutputs{{"dq", dq}, {"dk", dk}, {"dv", dv}};
               }});
}

void norm_cases(std::vector<OpCase>& c) {
  c.push_back({{"layernorm_forward", "residual_layernorm_forward", "layernorm_backward"}, "N 37 C 72", kHalf, true,
               true, &kReduction, [](const OpRun& r) {
                 const int64_t N = 37, C = 72;
                 Tensor inp = r.act_random({N, C}, 1, 1.0, 2.0), w = r.act_random({C}, 2, 0.2, 1.0);
                 Tensor b = r.act_random({C}, 3), out = r.act_out({N, C});
                 Tensor mean = r.acc_out({N}), rstd = r.acc_out({N});
                 layernorm_forward(out, mean, rstd, inp, w, b);
                 Tensor skip = r.act_random({N, C}, 4), res = r.act_out({N, C}), out2 = r.act_out({N, C});
                 Tensor mean2 = r.acc_out({N}), rstd2 = r.acc_out({N});
                 residual_layernorm_forward(res, out2, mean2, rstd2, inp, skip, w, b);
                 Tensor dout = r.act_random({N, C}, 5), dinp = r.act_random({N, C}, 6);
                 Tensor dw = r.acc_random({C}, 7), db = r.acc_random({C}, 8);
                 layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd);
                 return OpOutputs{{"out", out},   {"mean", mean},     {"rstd", rstd}, {"residual", res},
                                  {"out2", out2}, {"rstd2", rstd2},   {"dinp", dinp}, {"dweight", dw},
                                  {"dbias", db}};
               }});
  c.push_back({{"rmsnorm_forward", "rmsnorm_backward"}, "N 37 C 72", kHalf, true, true, &kReduction,
               [](const OpRun& r) {
                 const int64_t N = 37, C = 72;
                 Tensor inp = r.act_random({N, C}, 1), w = r.act_random({C}, 2, 0.2, 1.0);
                 Tensor out = r.act_out({N, C}), rstd = r.acc_out({N});
                 rmsnorm_forward(out, rstd, inp, w, 1e-5);
                 Tensor dout = r.act_random({N, C}, 3), dinp = r.act_random({N, C}, 4), dw = r.acc_random({C}, 5);
                 rmsnorm_backward(dinp, dw, dout, inp, w, rstd);
                 return OpOutputs{{"out", out}, {"rstd", rstd}, {"dinp", dinp}, {"dweight", dw}};
               }});
}

void elementwise_cases(std::vector<OpCase>& c) {
  c.push_back({{"gelu_forward", "gelu_backward"}, "N 37 C 72", kHalf, true, true, &kElementwise, [](const OpRun& r) {
                 Tensor inp = r.act_random({37, 72}, 1, 2.0), out = r.act_out({37, 72});
                 gelu_forward(out, inp);
                 Tensor dout = r.act_random({37, 72}, 2), dinp = r.act_out({37, 72});
                 gelu_backward(dinp, inp, dout);
                 return OpOutputs{{"out", out}, {"dinp", dinp}};
               }});
  c.push_back({{"swiglu_forward", "swiglu_backward"}, "N 37 C 72", kHalf, true, true, &kElementwise,
               [](const OpRun& r) {
                 Tensor gate = r.act_random({37, 72}, 1, 2.0), up = r.act_random({37, 72}, 2), out = r.act_out({37, 72});
                 swiglu_forward(out, gate, up);
                 Tensor dout = r.act_random({37, 72}, 3), dgate = r.act_out({37, 72}), dup = r.act_out({37, 72});
                 swiglu_backward(dgate, dup, dout, gate, up);
                 return OpOutputs{{"out", out}, {"dgate", dgate}, {"dup", dup}};
               }});
  c.push_back({{"rope_forward", "rope_backward"}, "B 2 T 9 NH 2 HS 8, q and k columns, positions from 5", kHalf, true,
               true, &kElementwise, [](const OpRun& r) {
                 Tensor x = r.act_random({2, 9, 48}, 1), dx = r.act_random({2, 9, 48}, 2);
                 rope_forward(x, 9, 8, kRopeTheta, 0, 32, 5);
                 rope_backward(dx, 9, 8, kRopeTheta, 0, 32, 5);
                 return OpOutputs{{"x", x}, {"dx", dx}};
               }});
  c.push_back({{"add_forward", "accumulate", "bias_add"}, "N 37 C 72", kHalf, true, true, &kElementwise,
               [](const OpRun& r) {
                 Tensor a = r.act_random({37, 72}, 1), b = r.act_random({37, 72}, 2), out = r.act_out({37, 72});
                 add_forward(out, a, b);
                 Tensor dst = r.act_random({37, 72}, 3), dst_acc = r.acc_random({37, 72}, 4);
                 accumulate(dst, a);
                 accumulate(dst_acc, a);  // a 16-bit gradient into an fp32 one
                 Tensor y = r.act_random({37, 72}, 5);
                 bias_add(y, r.act_random({72}, 6));
                 return OpOutputs{{"add", out}, {"accumulate", dst}, {"accumulate_acc", dst_acc}, {"bias_add", y}};
               }});
  OpCase divide{{"divide_"}, "N 37 C 72 / 3", kHalf, true, true, &kElementwise, [](const OpRun& r) {
                  Tensor t = r.act_random({37, 72}, 1);
                  divide_(t, 3);
                  return OpOutputs{{"t", t}};
                }};
  divide.fp64 = false;  // fp32, bf16 and fp16 (a collective's Avg)
  c.push_back(divide);
}

void embedding_loss_cases(std::vector<OpCase>& c) {
  c.push_back({{"embedding_forward", "embedding_backward"}, "B 2 T 19 C 24 Vp 128, plain and a vocabulary slice",
               kHalf, true, true, &kReduction, [](const OpRun& r) {
                 const int64_t B = 2, T = 19, C = 24;
                 Tensor tok = r.ints({B, T}, 1, 0, 101), wte = r.act_random({128, C}, 2), wpe = r.act_random({T, C}, 3);
                 Tensor out = r.act_out({B, T, C});
                 embedding_forward(out, tok, wte, wpe);
                 Tensor dout = r.act_random({B, T, C}, 4), dwte = r.acc_random({128, C}, 5), dwpe = r.acc_random({T, C}, 6);
                 embedding_backward(dwte, dwpe, dout, tok);
                 // Rows [64, 128) of the padded vocabulary on one tensor-parallel rank; no position term.
                 Tensor slice = r.act_random({64, C}, 7), out2 = r.act_out({B, T, C}), dslice = r.acc_random({64, C}, 8);
                 embedding_forward(out2, tok, slice, Tensor(), 64, 128);
                 embedding_backward(dslice, Tensor(), dout, tok, 64, 128);
                 return OpOutputs{{"out", out}, {"dwte", dwte}, {"dwpe", dwpe}, {"out_slice", out2}, {"dslice", dslice}};
               }});
  c.push_back({{"softmax_xent_forward_backward"}, "N 37 vocab 101 padded to 128", kHalf, true, true, &kReduction,
               [](const OpRun& r) {
                 Tensor logits = r.act_random({37, 128}, 1, 3.0), tgt = r.ints({37}, 2, 0, 101);
                 Tensor losses = r.acc_out({37}), dlogits = r.act_out({37, 128});
                 softmax_xent_forward_backward(losses, dlogits, logits, tgt, 101, 1.0 / 37);
                 return OpOutputs{{"losses", losses}, {"dlogits", dlogits}};
               }});
  c.push_back({{"vocab_parallel_xent_local_max", "vocab_parallel_xent_local_sums", "vocab_parallel_xent_finish"},
               "N 37, columns [64, 128) of vocab 101", kHalf, true, true, &kReduction, [](const OpRun& r) {
                 Tensor logits = r.act_random({37, 64}, 1, 3.0), tgt = r.ints({37}, 2, 0, 101);
                 Tensor row_max = r.acc_out({37}), stats = r.acc_out({2, 37});
                 vocab_parallel_xent_local_max(row_max, logits, 64, 101);
                 vocab_parallel_xent_local_sums(stats, logits, tgt, row_max, 64, 101);
                 Tensor losses = r.acc_out({37}), dlogits = r.act_out({37, 64});
                 vocab_parallel_xent_finish(losses, dlogits, logits, tgt, row_max, stats, 64, 101, 1.0 / 37);
                 return OpOutputs{{"row_max", row_max}, {"stats", stats}, {"losses", losses}, {"dlogits", dlogits}};
               }});
  c.push_back({{"sum_accumulate", "sum_squares_accumulate", "clip_scale"}, "2664 values", kHalf, true, true,
               &kReduction, [](const OpRun& r) {
                 Tensor x = r.act_random({37, 72}, 1), sum = r.acc_random({1}, 2), sq = r.acc_random({1}, 3, 0.0, 4.0);
                 sum_accumulate(sum, x);
                 sum_squares_accumulate(sq, x);
                 Tensor scale = r.acc_out({1}), norm = r.acc_out({1});
                 clip_scale(scale, norm, sq, 1.0, 0.5);
                 return OpOutputs{{"sum", sum}, {"sum_squares", sq}, {"scale", scale}, {"norm", norm}};
               }});
}

// The optimizers keep fp32 (or fp64) state: no 16-bit run. Three steps, so the state each step leaves is read back.
void optimizer_cases(std::vector<OpCase>& c) {
  c.push_back({{"adamw_update"}, "1001 parameters, 3 steps", {}, true, true, &kElementwise, [](const OpRun& r) {
                 Tensor p = r.acc_random({1001}, 1), g = r.acc_random({1001}, 2), m = r.acc_random({1001}, 3, 0.01);
                 Tensor v = r.acc_random({1001}, 4, 1e-4, 1e-3), gs = r.acc_random({1}, 5, 0.0, 0.5);
                 AdamWHyper h;
                 h.weight_decay = 0.1;
                 for (h.step = 1; h.step <= 3; ++h.step) adamw_update(p, g, m, v, gs, h);
                 return OpOutputs{{"params", p}, {"m", m}, {"v", v}};
               }});
  c.push_back({{"sgd_update"}, "1001 parameters, 3 steps", {}, true, true, &kElementwise, [](const OpRun& r) {
                 Tensor p = r.acc_random({1001}, 1), g = r.acc_random({1001}, 2), buf = r.acc_random({1001}, 3);
                 Tensor gs = r.acc_random({1}, 4, 0.0, 0.5);
                 SGDHyper h;
                 h.lr = 0.1, h.weight_decay = 0.1;
                 for (int step = 0; step < 3; ++step) sgd_update(p, g, buf, gs, h);
                 return OpOutputs{{"params", p}, {"buf", buf}};
               }});
  c.push_back({{"outer_nesterov_update"}, "1001 parameters, 3 steps", {}, true, true, &kElementwise,
               [](const OpRun& r) {
                 Tensor anchor = r.acc_random({1001}, 1), vel = r.acc_random({1001}, 2), x = r.acc_random({1001}, 3);
                 for (int step = 0; step < 3; ++step) outer_nesterov_update(anchor, vel, x, 0.7, 0.9);
                 return OpOutputs{{"anchor", anchor}, {"velocity", vel}, {"x", x}};
               }});
}
}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = [] {
    std::vector<OpCase> c;
    matmul_cases(c);
    attention_cases(c);
    norm_cases(c);
    elementwise_cases(c);
    embedding_loss_cases(c);
    optimizer_cases(c);
    return c;
  }();
  return cases;
}

}  // namespace mt::test
