// Ring attention over the zigzag layout (model/ring_attention.h): the layout helpers, the schedule, and the forward
// and backward passes. The op repacks its local [B, 2Tc, W] tensors into one [B, Tc, W] tensor per chunk, so that
// every block the kernels see is a contiguous (query chunk, key chunk) pair, and sends k and v as one message: a
// [4, B, Tc, KV*HS] buffer k0 | k1 | v0 | v1 (0, 1: the holder's two chunks in local order); dk | dv travel in the
// same layout in the accumulation dtype.
// Buffers in flight: k|v is double-buffered. At step s the op waits for its step s-1 send (the buffer the next k|v
// lands in), posts the receive of the next k|v and the send of the current one, computes the step's blocks, and
// waits for the receive before step s+1 uses it. Backward adds dk|dv: computed into a local buffer while the
// accumulator from the previous rank is in flight, then added to it and passed on.
#include "model/ring_attention.h"

#include "core/arena.h"
#include "core/check.h"
#include "kernels/elementwise.h"

namespace mt {

using kernels::BlockMask;

ZigzagChunks zigzag_chunks(int cp, int rank) {
  MT_CHECK(cp >= 1 && rank >= 0 && rank < cp, "zigzag_chunks: rank {} of cp = {}", rank, cp);
  return {rank, 2 * cp - 1 - rank};
}

std::vector<int64_t> zigzag_positions(int64_t T, int cp, int rank) {
  const ZigzagChunks z = zigzag_chunks(cp, rank);
  MT_CHECK(T > 0 && T % (2 * cp) == 0, "zigzag_positions: T = {} is not divisible by 2 * cp = {}", T, 2 * cp);
  const int64_t Tc = T / (2 * cp);
  std::vector<int64_t> pos;
  pos.reserve(size_t(2 * Tc));
  for (int c : {z.first, z.second})
    for (int64_t t = 0; t < Tc; ++t) pos.push_back(c * Tc + t);
  return pos;
}

namespace {

// Rows [dt0, dt0 + n) of every batch element of dst [B, dT, ...] = rows [st0, st0 + n) of src [B, sT, ...] (same B
// and trailing width), converted to dst's dtype where they differ (rounded once).
void copy_rows(const Tensor& dst, int64_t dt0, const Tensor& src, int64_t st0, int64_t n) {
  const int64_t B = dst.dim(0), dT = dst.dim(1), sT = src.dim(1), W = dst.numel() / (B * dT);
  for (int64_t b = 0; b < B; ++b)
    copy_convert(dst.slice((b * dT + dt0) * W, Shape{n * W}), src.slice((b * sT + st0) * W, Shape{n * W}));
}

// full [B, T, ...] and local [B, T/cp, ...]: checks, and returns Tc.
int64_t check_zigzag(const char* op, const Tensor& full, const Tensor& local, int cp, int rank) {
  zigzag_chunks(cp, rank);
  MT_CHECK(full.defined() && local.defined(), "{}: undefined tensor", op);
  MT_CHECK(full.device() == local.device(), "{}: full is on {} but local on {}", op, device_name(full.device()),
           device_name(local.device()));
  MT_CHECK(full.dtype() == local.dtype(), "{}: full is {} but local is {}", op, dtype_name(full.dtype()),
           dtype_name(local.dtype()));
  MT_CHECK(full.ndim() >= 2 && local.ndim() == full.ndim(), "{}: full {} and local {} must be [B, T, ...]", op,
           full.shape().str(), local.shape().str());
  const int64_t T = full.dim(1);
  MT_CHECK(T % (2 * cp) == 0, "{}: T = {} is not divisible by 2 * cp = {}", op, T, 2 * cp);
  Shape expected = full.shape();
  expected.d[1] = T / cp;
  MT_CHECK(local.shape() == expected, "{}: local has shape {}, expected {} (full {} over cp = {})", op,
           local.shape().str(), expected.str(), full.shape().str(), cp);
  return T / (2 * cp);
}

}  // namespace

void zigzag_shard(const Tensor& local, const Tensor& full, int cp, int rank) {
  const int64_t Tc = check_zigzag("zigzag_shard", full, local, cp, rank);
  const ZigzagChunks z = zigzag_chunks(cp, rank);
  copy_rows(local, 0, full, z.first * Tc, Tc);
  copy_rows(local, Tc, full, z.second * Tc, Tc);
}

void zigzag_unshard(const Tensor& full, const Tensor& local, int cp, int rank) {
  const int64_t Tc = check_zigzag("zigzag_unshard", full, local, cp, rank);
  const ZigzagChunks z = zigzag_chunks(cp, rank);
  copy_rows(full, z.first * Tc, local, 0, Tc);
  copy_rows(full, z.second * Tc, local, Tc, Tc);
}

RingStep ring_attention_step(int cp, int rank, int step) {
  MT_CHECK(cp >= 1 && rank >= 0 && rank < cp && step >= 0 && step < cp,
           "ring_attention_step: rank {} step {} of cp = {}", rank, step, cp);
  RingStep s;
  s.source = (rank - step + cp) % cp;
  auto add = [&](int qc, int kc, BlockMask m) { s.block[s.count++] = RingBlock{qc, kc, m}; };
  if (step == 0) {
    add(0, 0, BlockMask::Causal), add(1, 1, BlockMask::Causal), add(1, 0, BlockMask::Full);
  } else if (s.source < rank) {
    add(0, 0, BlockMask::Full), add(1, 0, BlockMask::Full);
  } else {
    add(1, 0, BlockMask::Full), add(1, 1, BlockMask::Full);
  }
  return s;
}

Shape ring_attention_lse_shape(int64_t B, int n_head, int64_t T_local) { return Shape{2, B, n_head, T_local / 2}; }

namespace {

struct RingDims {
  int64_t B, Tc, C, KW;
  int NH, KV;
};

void check_like(const char* op, const Tensor& t, const char* name, const Tensor& q, const Shape& s) {
  MT_CHECK(t.defined(), "{}: {} is undefined", op, name);
  MT_CHECK(t.dtype() == q.dtype() && t.device() == q.device(), "{}: {} is {} on {}, q is {} on {}", op, name,
           dtype_name(t.dtype()), device_name(t.device()), dtype_name(q.dtype()), device_name(q.device()));
  MT_CHECK(t.shape() == s, "{}: {} has shape {}, expected {}", op, name, t.shape().str(), s.str());
}

RingDims check_ring(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& lse, int n_head, int n_kv_head, int tag_base) {
  MT_CHECK(q.defined(), "{}: q is undefined", op);
  MT_CHECK(q.dtype() == DType::F32 || q.dtype() == DType::F64 || q.dtype() == DType::BF16 || q.dtype() == DType::F16,
           "{}: q must be fp32, fp64, bf16 or fp16, is {}", op, dtype_name(q.dtype()));
  MT_CHECK(q.ndim() == 3 && q.dim(1) % 2 == 0, "{}: q must be [B, 2Tc, NH*HS] (two chunks), has shape {}", op,
           q.shape().str());
  MT_CHECK(n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0 && q.dim(2) % n_head == 0,
           "{}: n_head = {}, n_kv_head = {} and q's width {} do not fit (NH a multiple of KV, width a multiple of NH)",
           op, n_head, n_kv_head, q.dim(2));
  MT_CHECK(tag_base >= 0, "{}: tag_base = {} must be >= 0", op, tag_base);
  RingDims d{q.dim(0), q.dim(1) / 2, q.dim(2), q.dim(2) / n_head * n_kv_head, n_head, n_kv_head};
  check_like(op, k, "k", q, Shape{d.B, 2 * d.Tc, d.KW});
  check_like(op, v, "v", q, Shape{d.B, 2 * d.Tc, d.KW});
  MT_CHECK(lse.defined() && lse.dtype() == acc_dtype(q.dtype()) && lse.device() == q.device() &&
               lse.shape() == ring_attention_lse_shape(d.B, n_head, 2 * d.Tc),
           "{}: lse must be {} {}, is {} {}", op, dtype_name(acc_dtype(q.dtype())),
           ring_attention_lse_shape(d.B, n_head, 2 * d.Tc).str(), dtype_name(lse.dtype()), lse.shape().str());
  return d;
}

// Temporaries: from the caller's arena, else owned by the returned tensor, on the device of the op's tensors.
struct Alloc {
  Arena* arena;
  Device device;
  Tensor operator()(Shape s, DType t) const { return arena ? arena->alloc(s, t) : Tensor::empty(s, t, device); }
};

// Part i of a [4, B, Tc, KW] k|v (or dk|dv) buffer: k0, k1, v0, v1.
Tensor part(const Tensor& buf, int i) {
  const int64_t n = buf.numel() / 4;
  return buf.slice(i * n, Shape{buf.dim(1), buf.dim(2), buf.dim(3)});
}

// The k|v buffer of this rank's own chunks.
void pack_kv(const Tensor& buf, const Tensor& k, const Tensor& v, int64_t Tc) {
  for (int c = 0; c < 2; ++c) copy_rows(part(buf, c), 0, k, c * Tc, Tc), copy_rows(part(buf, 2 + c), 0, v, c * Tc, Tc);
}

// The forward pass's temporaries: the query chunks and their accumulators, the k|v held and the one arriving, and a
// block's partial result.
struct ForwardBuffers {
  Tensor qc[2], acc[2], kv[2], part_out, part_lse;
  ForwardBuffers(const Alloc& alloc, const RingDims& d, DType S, int P) {
    const DType A = acc_dtype(S);
    const Shape qshape{d.B, d.Tc, d.C}, kvshape{4, d.B, d.Tc, d.KW};
    for (int c = 0; c < 2; ++c) qc[c] = alloc(qshape, S), acc[c] = alloc(qshape, A);
    kv[0] = alloc(kvshape, S);
    if (P > 1) kv[1] = alloc(kvshape, S);
    part_out = alloc(qshape, A), part_lse = alloc(Shape{d.B, d.NH, d.Tc}, A);
  }
};

// The backward pass's: the query, output-gradient and output chunks, the query gradients, the k|v held and arriving,
// their gradient accumulators, and a step's own share while an accumulator is in flight.
struct BackwardBuffers {
  Tensor qc[2], gc[2], oc[2], dqc[2], kv[2], dkv[2], local;
  BackwardBuffers(const Alloc& alloc, const RingDims& d, DType S, int P) {
    const DType A = acc_dtype(S);
    const Shape qshape{d.B, d.Tc, d.C}, kvshape{4, d.B, d.Tc, d.KW};
    for (int c = 0; c < 2; ++c)
      qc[c] = alloc(qshape, S), gc[c] = alloc(qshape, S), oc[c] = alloc(qshape, S), dqc[c] = alloc(qshape, A);
    kv[0] = alloc(kvshape, S);
    if (P > 1) kv[1] = alloc(kvshape, S);
    dkv[0] = alloc(kvshape, A);
    if (P > 1) dkv[1] = alloc(kvshape, A), local = alloc(kvshape, A);
  }
};

// Chunk c's lse [B, NH, Tc] within lse [2, B, NH, Tc].
Tensor lse_chunk(const Tensor& lse, int c) {
  return lse.slice(c * (lse.numel() / 2), Shape{lse.dim(1), lse.dim(2), lse.dim(3)});
}

}  // namespace

void ring_attention_forward(Communicator& cp, const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                            const Tensor& v, int n_head, int n_kv_head, int tag_base, Arena* scratch) {
  const char* op = "ring_attention_forward";
  const RingDims d = check_ring(op, q, k, v, lse, n_head, n_kv_head, tag_base);
  check_like(op, out, "out", q, q.shape());
  const DType S = q.dtype();
  const int P = cp.size(), r = cp.rank(), next = (r + 1) % P, prev = (r + P - 1) % P;
  const ForwardBuffers buf(Alloc{scratch, q.device()}, d, S, P);
  const Tensor(&qc)[2] = buf.qc, (&acc)[2] = buf.acc, (&kv)[2] = buf.kv, &part_out = buf.part_out,
               &part_lse = buf.part_lse;
  for (int c = 0; c < 2; ++c) copy_rows(qc[c], 0, q, c * d.Tc, d.Tc);
  pack_kv(kv[0], k, v, d.Tc);

  bool started[2] = {false, false};
  WorkPtr send, recv;
  for (int s = 0; s < P; ++s) {
    const Tensor& cur = kv[s % 2];
    if (s + 1 < P) {
      if (send) send->wait();  // kv[(s+1) % 2] left at step s-1: it is free for the next k|v
      recv = cp.recv_async(kv[(s + 1) % 2], prev, tag_base);
      send = cp.send_async(cur, next, tag_base);
    }
    for (const RingBlock& b : ring_attention_step(P, r, s)) {
      const Tensor kc = part(cur, b.kv_chunk), vc = part(cur, 2 + b.kv_chunk), lc = lse_chunk(lse, b.q_chunk);
      if (!started[b.q_chunk]) {  // the chunk's first block (its diagonal) starts the merge
        kernels::attention_block_forward(acc[b.q_chunk], lc, qc[b.q_chunk], kc, vc, n_head, n_kv_head, b.mask);
        started[b.q_chunk] = true;
      } else {
        kernels::attention_block_forward(part_out, part_lse, qc[b.q_chunk], kc, vc, n_head, n_kv_head, b.mask);
        kernels::attention_block_merge(acc[b.q_chunk], lc, part_out, part_lse, n_head);
      }
    }
    if (s + 1 < P) recv->wait();
  }
  if (send) send->wait();
  for (int c = 0; c < 2; ++c) copy_rows(out, c * d.Tc, acc[c], 0, d.Tc);
}

void ring_attention_backward(Communicator& cp, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                             const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, int n_head, int n_kv_head, int tag_base, Arena* scratch) {
  const char* op = "ring_attention_backward";
  const RingDims d = check_ring(op, q, k, v, lse, n_head, n_kv_head, tag_base);
  check_like(op, out, "out", q, q.shape());
  check_like(op, dout, "dout", q, q.shape());
  check_like(op, dq, "dq", q, q.shape());
  check_like(op, dk, "dk", q, k.shape());
  check_like(op, dv, "dv", q, v.shape());
  const DType S = q.dtype();
  const int P = cp.size(), r = cp.rank(), next = (r + 1) % P, prev = (r + P - 1) % P;
  const int kv_tag = tag_base + 1, grad_tag = tag_base + 2;
  const BackwardBuffers buf(Alloc{scratch, q.device()}, d, S, P);
  const Tensor(&qc)[2] = buf.qc, (&gc)[2] = buf.gc, (&oc)[2] = buf.oc, (&dqc)[2] = buf.dqc, (&kv)[2] = buf.kv;
  for (int c = 0; c < 2; ++c) {
    copy_rows(qc[c], 0, q, c * d.Tc, d.Tc);
    copy_rows(gc[c], 0, dout, c * d.Tc, d.Tc);
    copy_rows(oc[c], 0, out, c * d.Tc, d.Tc);
    zero_(dqc[c]);
  }
  pack_kv(kv[0], k, v, d.Tc);
  // dkv[s % 2]: the accumulator of the k|v held at step s; local: this step's share while it is in flight.
  const Tensor(&dkv)[2] = buf.dkv, &local = buf.local;

  WorkPtr kv_send, kv_recv, g_send, g_recv;
  for (int s = 0; s < P; ++s) {
    const Tensor& cur = kv[s % 2];
    if (s + 1 < P) {
      if (kv_send) kv_send->wait();
      kv_recv = cp.recv_async(kv[(s + 1) % 2], prev, kv_tag);
      kv_send = cp.send_async(cur, next, kv_tag);
    }
    WorkPtr g_recv_next;
    if (P > 1) {
      // The accumulator of the k|v held next (at s = P-1: this rank's own, complete) arrives in dkv[(s+1) % 2],
      // which left at step s-1.
      if (g_send) g_send->wait();
      g_recv_next = cp.recv_async(dkv[(s + 1) % 2], prev, grad_tag);
    }
    const Tensor& target = s == 0 ? dkv[0] : local;
    zero_(target);
    for (const RingBlock& b : ring_attention_step(P, r, s)) {
      const int qi = b.q_chunk, ki = b.kv_chunk;
      kernels::attention_block_backward(dqc[qi], part(target, ki), part(target, 2 + ki), gc[qi], oc[qi],
                                        lse_chunk(lse, qi), qc[qi], part(cur, ki), part(cur, 2 + ki), n_head,
                                        n_kv_head, b.mask);
    }
    if (s > 0) {
      g_recv->wait();
      kernels::accumulate(dkv[s % 2], local);
    }
    if (P > 1) g_send = cp.send_async(dkv[s % 2], next, grad_tag);
    g_recv = g_recv_next;
    if (s + 1 < P) kv_recv->wait();
  }
  if (g_recv) g_recv->wait();
  if (kv_send) kv_send->wait();
  if (g_send) g_send->wait();
  // This rank's own k|v gradients: after P hops (P > 1) in dkv[P % 2]; with no ring, the step-0 accumulator.
  const Tensor& mine = P > 1 ? dkv[P % 2] : dkv[0];
  for (int c = 0; c < 2; ++c) {
    copy_rows(dq, c * d.Tc, dqc[c], 0, d.Tc);
    copy_rows(dk, c * d.Tc, part(mine, c), 0, d.Tc);
    copy_rows(dv, c * d.Tc, part(mine, 2 + c), 0, d.Tc);
  }
}

int64_t ring_attention_temp_bytes(int64_t B, int64_t T_local, int64_t q_width, int64_t kv_width, int n_head,
                                  DType S, int cp, bool backward) {
  const RingDims d{B, T_local / 2, q_width, kv_width, n_head, n_head};
  Arena counter{Arena::CountOnly{}};
  if (backward)
    BackwardBuffers(Alloc{&counter, Device::CPU}, d, S, cp);
  else
    ForwardBuffers(Alloc{&counter, Device::CPU}, d, S, cp);
  return int64_t(counter.high_water_bytes());
}

}  // namespace mt
