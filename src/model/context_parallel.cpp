// Context parallelism's layers (see context_parallel.h).
#include "model/context_parallel.h"

#include <algorithm>
#include <vector>

#include "core/arena.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/gqa.h"
#include "kernels/rope.h"
#include "model/ring_attention.h"

namespace mt {

int64_t ContextParallel::chunk_start(int c, int64_t T_local) const {
  const ZigzagChunks z = zigzag_chunks(size(), rank());
  return (c == 0 ? z.first : z.second) * (T_local / 2);
}

void gather_positions(const ContextParallel& cp, const Tensor& pos_local, const Tensor& wpe) {
  const int64_t T = pos_local.shape()[0], C = pos_local.shape()[1], Tc = T / 2;
  for (int c = 0; c < 2; ++c)
    copy_convert(pos_local.slice(c * Tc * C, {Tc * C}), wpe.slice(cp.chunk_start(c, T) * C, {Tc * C}));
}

void scatter_position_grads(const ContextParallel& cp, const Tensor& dwpe, const Tensor& dpos_local) {
  const int64_t T = dpos_local.shape()[0], C = dpos_local.shape()[1], Tc = T / 2;
  for (int c = 0; c < 2; ++c)
    kernels::accumulate(dwpe.slice(cp.chunk_start(c, T) * C, {Tc * C}), dpos_local.slice(c * Tc * C, {Tc * C}));
}

namespace {

// Each sequence's two chunks apart, each at its first token's global position.
template <typename Rope>
void rope_chunks(const ContextParallel& cp, const Tensor& x, int64_t T_local, const Rope& rope) {
  if (!cp.on()) return rope(x, T_local, 0);
  const int64_t W = x.shape()[1], B = x.shape()[0] / T_local, Tc = T_local / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int c = 0; c < 2; ++c) rope(x.slice((b * T_local + c * Tc) * W, {Tc, W}), Tc, cp.chunk_start(c, T_local));
}

}  // namespace

void rope_forward_cp(const ContextParallel& cp, const Tensor& x, int64_t T_local, int64_t head_size, double theta,
                     int64_t col_begin, int64_t col_end) {
  rope_chunks(cp, x, T_local, [&](const Tensor& rows, int64_t T, int64_t offset) {
    kernels::rope_forward(rows, T, head_size, theta, col_begin, col_end, offset);
  });
}

void rope_backward_cp(const ContextParallel& cp, const Tensor& dx, int64_t T_local, int64_t head_size, double theta,
                      int64_t col_begin, int64_t col_end) {
  rope_chunks(cp, dx, T_local, [&](const Tensor& rows, int64_t T, int64_t offset) {
    kernels::rope_backward(rows, T, head_size, theta, col_begin, col_end, offset);
  });
}

Shape attention_record_shape_cp(const ContextParallel& cp, Device d, int64_t B, int64_t n_head, int64_t T_local) {
  return cp.on() ? ring_attention_lse_shape(B, int(n_head), T_local)
                 : kernels::attention_record_shape(d, B, n_head, T_local);
}

DType attention_record_dtype_cp(const ContextParallel& cp, Device d, DType S) {
  return cp.on() ? acc_dtype(S) : kernels::attention_record_dtype(d, S);
}

namespace {
// GPT-2's packed q|k|v taken apart for the ring: q, k and v in the forward pass, and dq, dk, dv too in the backward,
// each of the output's shape.
constexpr int kPackedForwardCopies = 3, kPackedBackwardCopies = 6;
std::vector<Tensor> packed_copies(int n, const Tensor& out) {
  std::vector<Tensor> t(n);
  for (Tensor& x : t) x = Tensor::empty(out.shape(), out.dtype(), out.device());
  return t;
}
}  // namespace

int64_t attention_temp_bytes(const ContextParallel& cp, bool packed, int64_t B, int64_t T_local, int64_t q_width,
                             int64_t kv_width, int n_head, DType S) {
  if (!cp.on()) return 0;
  int64_t most = 0;
  for (const bool backward : {false, true}) {
    // The copies counted as an arena counts them (rounded as Tensor::empty rounds a non-empty tensor).
    Arena copies{Arena::CountOnly{}};
    for (int i = 0; packed && i < (backward ? kPackedBackwardCopies : kPackedForwardCopies); ++i)
      copies.alloc(Shape{B, T_local, q_width}, S);
    most = std::max(most, int64_t(copies.high_water_bytes()) +
                              ring_attention_temp_bytes(B, T_local, q_width, kv_width, n_head, S, cp.size(), backward));
  }
  return most;
}

void packed_attention_forward(const ContextParallel& cp, const Tensor& out, const Tensor& record, const Tensor& qkv,
                              int n_head, int tag) {
  if (!cp.on()) return kernels::attention_forward(out, record, qkv, n_head);
  const Shape s = out.shape();
  const std::vector<Tensor> t = packed_copies(kPackedForwardCopies, out);
  const Tensor &q = t[0], &k = t[1], &v = t[2];
  kernels::gqa_reduce(q, k, v, qkv, n_head, n_head, int(s[2] / n_head));  // with as many kv heads: a split
  ring_attention_forward(cp.comm(), out, record, q, k, v, n_head, n_head, tag);
}

void packed_attention_backward(const ContextParallel& cp, const Tensor& dqkv, const Tensor& datt, const Tensor& dout,
                               const Tensor& qkv, const Tensor& out, const Tensor& record, int n_head, int tag) {
  if (!cp.on()) return kernels::attention_backward(dqkv, datt, dout, qkv, out, record, n_head);
  const Shape s = out.shape();
  const int hs = int(s[2] / n_head);
  const std::vector<Tensor> t = packed_copies(kPackedBackwardCopies, out);
  const Tensor &q = t[0], &k = t[1], &v = t[2], &dq = t[3], &dk = t[4], &dv = t[5];
  kernels::gqa_reduce(q, k, v, qkv, n_head, n_head, hs);
  ring_attention_backward(cp.comm(), dq, dk, dv, dout, q, k, v, out, record, n_head, n_head, tag);
  kernels::gqa_expand(dqkv, dq, dk, dv, n_head, n_head, hs);
}

void gqa_attention_forward(const ContextParallel& cp, const Tensor& out, const Tensor& record, const Tensor& qkv,
                           const Tensor& q, const Tensor& k, const Tensor& v, int n_head, int n_kv_head, int tag) {
  if (cp.on()) return ring_attention_forward(cp.comm(), out, record, q, k, v, n_head, n_kv_head, tag);
  kernels::gqa_expand(qkv, q, k, v, n_head, n_kv_head, int(q.dim(-1) / n_head));
  kernels::attention_forward(out, record, qkv, n_head);
}

void gqa_attention_backward(const ContextParallel& cp, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                            const Tensor& dqkv, const Tensor& datt, const Tensor& dout, const Tensor& qkv,
                            const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& record,
                            int n_head, int n_kv_head, int tag) {
  if (cp.on()) return ring_attention_backward(cp.comm(), dq, dk, dv, dout, q, k, v, out, record, n_head, n_kv_head, tag);
  kernels::attention_backward(dqkv, datt, dout, qkv, out, record, n_head);
  kernels::gqa_reduce(dq, dk, dv, dqkv, n_head, n_kv_head, int(q.dim(-1) / n_head));
}

}  // namespace mt
