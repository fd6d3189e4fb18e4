// Block attention for ring attention (kernels/attention_block.h): argument checks, device dispatch (the GPU kernels
// are kernels/cuda/attention_block_cuda.cu) and the CPU kernels. One OpenMP task per (batch, query head) in the
// forward pass and per (batch, kv head) in the backward pass (the query heads of one kv head add into the same dk,
// dv rows, so they run in one task, in head order). The products are Eigen GEMMs on strided views of the tensors
// (fp32, fp64) or on widened fp32 copies of one head (bf16, fp16), in the calling thread's scratch. A diagonal
// block computes its whole Tq x Tk score matrix and zeroes the masked half: diagonal blocks are 2 of the 2*cp + 1
// blocks a rank computes per layer (model/ring_attention.h), so skipping half of their products is left for later.
#include "kernels/attention_block.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/storage.h"
#include "kernels/cuda/attention_block_cuda.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
namespace cpu {
namespace {

// Grow-only scratch of the calling thread, one buffer per (type, slot).
template <typename T, int kSlot>
T* scratch(int64_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < size_t(n)) buf.resize(size_t(n));
  return buf.data();
}

// One head's rows [rows, HS] of an S tensor (leading dimension ld), readable in A.
template <typename A>
struct View {
  const A* p;
  int64_t ld;
};

// fp32 and fp64: the tensor itself. 16-bit: a widened copy in scratch slot kSlot.
template <int kSlot, typename S>
View<acc_t<S>> as_acc(const S* src, int64_t rows, int64_t HS, int64_t ld) {
  if constexpr (!is_16bit<S>) {
    return {src, ld};
  } else {
    float* d = scratch<float, kSlot>(rows * HS);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < HS; ++c) d[r * HS + c] = load(src[r * ld + c]);
    return {d, HS};
  }
}

// 16-bit S: each probability rounded to S (and read back), as the attention kernel stores them; else nothing.
template <typename S, typename A>
void round_like_storage(A* p, int64_t n) {
  if constexpr (is_16bit<S>) {
    for (int64_t i = 0; i < n; ++i) {
      S t;
      store(t, p[i]);
      p[i] = load(t);
    }
  } else {
    (void)p, (void)n;
  }
}

struct Dims {
  int64_t B, Tq, Tk, NH, KV, HS;
};

template <typename S>
void block_forward(acc_t<S>* out, acc_t<S>* lse, const S* q, const S* k, const S* v, const Dims& d, bool causal) {
  using A = acc_t<S>;
  const int64_t B = d.B, Tq = d.Tq, Tk = d.Tk, NH = d.NH, HS = d.HS;
  const int64_t C = NH * HS, KW = d.KV * HS, group = NH / d.KV;
  const A scale = A(1) / std::sqrt(A(HS));
#pragma omp parallel for schedule(static) if (B * NH > 1 && B * Tq * C > kParallelGrain)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH, g = h / group;
    const View<A> qh = as_acc<0>(q + b * Tq * C + h * HS, Tq, HS, C);
    const View<A> kh = as_acc<1>(k + b * Tk * KW + g * HS, Tk, HS, KW);
    const View<A> vh = as_acc<2>(v + b * Tk * KW + g * HS, Tk, HS, KW);
    A* p = scratch<A, 3>(Tq * Tk);
    mat(p, Tq, Tk, Tk).noalias() = scale * (cmat(qh.p, Tq, HS, qh.ld) * cmat(kh.p, Tk, HS, kh.ld).transpose());
    for (int64_t i = 0; i < Tq; ++i) {
      const int64_t n = causal ? i + 1 : Tk;
      ArrMap<A> row(p + i * Tk, n);
      const A mx = row.maxCoeff();
      row = (row - mx).exp();
      const A sum = row.sum();
      row *= A(1) / sum;
      std::fill(p + i * Tk + n, p + (i + 1) * Tk, A(0));
      lse[bh * Tq + i] = mx + std::log(sum);
    }
    round_like_storage<S>(p, Tq * Tk);
    mat(out + b * Tq * C + h * HS, Tq, HS, C).noalias() = cmat(static_cast<const A*>(p), Tq, Tk, Tk) *
                                                         cmat(vh.p, Tk, HS, vh.ld);
  }
}

template <typename A>
void block_merge(A* out, A* lse, const A* ob, const A* lb, int64_t B, int64_t Tq, int64_t NH, int64_t HS) {
  const int64_t C = NH * HS;
  const A inf = std::numeric_limits<A>::infinity();
#pragma omp parallel for schedule(static) if (B * Tq * C > kParallelGrain)
  for (int64_t bt = 0; bt < B * Tq; ++bt) {
    const int64_t b = bt / Tq, i = bt % Tq;
    for (int64_t h = 0; h < NH; ++h) {
      A& la = lse[(b * NH + h) * Tq + i];
      const A lbv = lb[(b * NH + h) * Tq + i];
      A* o = out + bt * C + h * HS;
      const A* x = ob + bt * C + h * HS;
      if (lbv == -inf) continue;  // nothing to add
      if (la == -inf) {           // nothing yet: take the block as it is
        std::copy(x, x + HS, o);
        la = lbv;
        continue;
      }
      const A m = std::max(la, lbv), L = m + std::log1p(std::exp(-std::abs(la - lbv)));
      const A wa = std::exp(la - L), wb = std::exp(lbv - L);
      for (int64_t c = 0; c < HS; ++c) o[c] = wa * o[c] + wb * x[c];
      la = L;
    }
  }
}

template <typename S>
void block_backward(acc_t<S>* dq, acc_t<S>* dk, acc_t<S>* dv, const S* dout, const S* out, const acc_t<S>* lse,
                    const S* q, const S* k, const S* v, const Dims& d, bool causal) {
  using A = acc_t<S>;
  const int64_t B = d.B, Tq = d.Tq, Tk = d.Tk, NH = d.NH, KV = d.KV, HS = d.HS;
  const int64_t C = NH * HS, KW = KV * HS, group = NH / KV;
  const A scale = A(1) / std::sqrt(A(HS));
#pragma omp parallel for schedule(static) if (B * KV > 1 && B * Tq * C > kParallelGrain)
  for (int64_t bg = 0; bg < B * KV; ++bg) {
    const int64_t b = bg / KV, g = bg % KV;
    const View<A> kh = as_acc<1>(k + b * Tk * KW + g * HS, Tk, HS, KW);
    const View<A> vh = as_acc<2>(v + b * Tk * KW + g * HS, Tk, HS, KW);
    A* dkh = dk + b * Tk * KW + g * HS;
    A* dvh = dv + b * Tk * KW + g * HS;
    A* p = scratch<A, 5>(Tq * Tk);
    A* dp = scratch<A, 6>(Tq * Tk);
    A* D = scratch<A, 7>(Tq);
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const View<A> qh = as_acc<0>(q + b * Tq * C + h * HS, Tq, HS, C);
      const View<A> gh = as_acc<3>(dout + b * Tq * C + h * HS, Tq, HS, C);
      const View<A> oh = as_acc<4>(out + b * Tq * C + h * HS, Tq, HS, C);
      const A* L = lse + (b * NH + h) * Tq;
      for (int64_t i = 0; i < Tq; ++i) {
        A s = 0;
        for (int64_t c = 0; c < HS; ++c) s += gh.p[i * gh.ld + c] * oh.p[i * oh.ld + c];
        D[i] = s;
      }
      // P = exp(s - lse): the merged softmax's probabilities on this block's keys (0 where masked).
      mat(p, Tq, Tk, Tk).noalias() = scale * (cmat(qh.p, Tq, HS, qh.ld) * cmat(kh.p, Tk, HS, kh.ld).transpose());
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t n = causal ? i + 1 : Tk;
        ArrMap<A> row(p + i * Tk, n);
        row = (row - L[i]).exp();
        std::fill(p + i * Tk + n, p + (i + 1) * Tk, A(0));
      }
      round_like_storage<S>(p, Tq * Tk);
      const A* cp = p;
      // dV += P^T dO; dP = dO V^T; dS = P (dP - D) * scale (0 where P is).
      mat(dvh, Tk, HS, KW).noalias() += cmat(cp, Tq, Tk, Tk).transpose() * cmat(gh.p, Tq, HS, gh.ld);
      mat(dp, Tq, Tk, Tk).noalias() = cmat(gh.p, Tq, HS, gh.ld) * cmat(vh.p, Tk, HS, vh.ld).transpose();
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t n = causal ? i + 1 : Tk;
        A* r = dp + i * Tk;
        const A* pi = cp + i * Tk;
        for (int64_t j = 0; j < n; ++j) r[j] = pi[j] * (r[j] - D[i]) * scale;
        std::fill(r + n, r + Tk, A(0));
      }
      // dQ += dS K; dK += dS^T Q.
      const A* cds = dp;
      mat(dq + b * Tq * C + h * HS, Tq, HS, C).noalias() += cmat(cds, Tq, Tk, Tk) * cmat(kh.p, Tk, HS, kh.ld);
      mat(dkh, Tk, HS, KW).noalias() += cmat(cds, Tq, Tk, Tk).transpose() * cmat(qh.p, Tq, HS, qh.ld);
    }
  }
}

}  // namespace
}  // namespace cpu

using namespace detail;

namespace {

// q [B, Tq, NH*HS], k and v [B, Tk, KV*HS]: one activation dtype and device. Returns the dimensions.
cpu::Dims check_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, int n_head, int n_kv_head,
                       BlockMask mask) {
  check_defined(q, op, "q"), check_activation(q, op, "q");
  for (auto [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    check_defined(*t, op, name), check_same_dtype(*t, q, op, name, "q"), check_same_device(*t, q, op, name, "q");
  }
  MT_CHECK(q.ndim() == 3, "{}: q must be [B, Tq, NH*HS], has shape {}", op, q.shape().str());
  MT_CHECK(n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0,
           "{}: n_head = {} must be a positive multiple of n_kv_head = {}", op, n_head, n_kv_head);
  MT_CHECK(q.dim(2) % n_head == 0, "{}: q's width {} is not divisible by n_head = {}", op, q.dim(2), n_head);
  cpu::Dims d{q.dim(0), q.dim(1), k.ndim() == 3 ? k.dim(1) : -1, n_head, n_kv_head, q.dim(2) / n_head};
  check_shape(k, Shape{d.B, d.Tk, d.KV * d.HS}, op, "k");
  check_shape(v, Shape{d.B, d.Tk, d.KV * d.HS}, op, "v");
  MT_CHECK(mask != BlockMask::Causal || d.Tq == d.Tk, "{}: a causal (diagonal) block needs Tq == Tk, has {} and {}",
           op, d.Tq, d.Tk);
  return d;
}

// An accumulation-dtype argument (block output, lse, gradients) of shape s on q's device.
void check_acc(const char* op, const Tensor& t, const char* name, const Tensor& q, const Shape& s) {
  check_defined(t, op, name), check_acc_dtype(t, q.dtype(), op, name);
  check_same_device(t, q, op, name, "q"), check_shape(t, s, op, name);
}
}  // namespace

void attention_block_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             int n_head, int n_kv_head, BlockMask mask) {
  const char* op = "attention_block_forward";
  const cpu::Dims d = check_inputs(op, q, k, v, n_head, n_kv_head, mask);
  check_acc(op, out, "out", q, q.shape());
  check_acc(op, lse, "lse", q, Shape{d.B, d.NH, d.Tq});
  if (q.device() == Device::CUDA)
    MT_ON_CUDA(op, gpu::attention_block_forward(out, lse, q, k, v, n_head, n_kv_head, mask == BlockMask::Causal));
  dispatch_storage(q.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = cpu::acc_t<S>;
    cpu::block_forward<S>(out.data_as<A>(), lse.data_as<A>(), storage_ptr<S>(q), storage_ptr<S>(k),
                          storage_ptr<S>(v), d, mask == BlockMask::Causal);
  });
}

void attention_block_merge(const Tensor& out, const Tensor& lse, const Tensor& out_b, const Tensor& lse_b,
                           int n_head) {
  const char* op = "attention_block_merge";
  check_defined(out, op, "out"), check_float(out, op, "out");
  MT_CHECK(out.ndim() == 3 && n_head > 0 && out.dim(2) % n_head == 0,
           "{}: out must be [B, Tq, NH*HS] with NH = n_head = {}, has shape {}", op, n_head, out.shape().str());
  const int64_t B = out.dim(0), Tq = out.dim(1), HS = out.dim(2) / n_head;
  const Shape ls{B, n_head, Tq};
  for (auto [t, name, s] : {std::tuple{&lse, "lse", ls}, std::tuple{&out_b, "out_b", out.shape()},
                            std::tuple{&lse_b, "lse_b", ls}}) {
    check_defined(*t, op, name), check_same_dtype(*t, out, op, name, "out");
    check_same_device(*t, out, op, name, "out"), check_shape(*t, s, op, name);
  }
  if (out.device() == Device::CUDA) MT_ON_CUDA(op, gpu::attention_block_merge(out, lse, out_b, lse_b, n_head));
  if (out.dtype() == DType::F64)
    cpu::block_merge(out.data_as<double>(), lse.data_as<double>(), out_b.data_as<double>(), lse_b.data_as<double>(),
                     B, Tq, n_head, HS);
  else
    cpu::block_merge(out.data_as<float>(), lse.data_as<float>(), out_b.data_as<float>(), lse_b.data_as<float>(), B,
                     Tq, n_head, HS);
}

void attention_block_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                              const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                              int n_head, int n_kv_head, BlockMask mask) {
  const char* op = "attention_block_backward";
  const cpu::Dims d = check_inputs(op, q, k, v, n_head, n_kv_head, mask);
  for (auto [t, name] : {std::pair{&dout, "dout"}, std::pair{&out, "out"}}) {
    check_defined(*t, op, name), check_same_dtype(*t, q, op, name, "q");
    check_same_device(*t, q, op, name, "q"), check_shape(*t, q.shape(), op, name);
  }
  check_acc(op, lse, "lse", q, Shape{d.B, d.NH, d.Tq});
  check_acc(op, dq, "dq", q, q.shape());
  check_acc(op, dk, "dk", q, k.shape());
  check_acc(op, dv, "dv", q, v.shape());
  if (q.device() == Device::CUDA)
    MT_ON_CUDA(op, gpu::attention_block_backward(dq, dk, dv, dout, out, lse, q, k, v, n_head, n_kv_head,
                                                 mask == BlockMask::Causal));
  dispatch_storage(q.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = cpu::acc_t<S>;
    cpu::block_backward<S>(dq.data_as<A>(), dk.data_as<A>(), dv.data_as<A>(), storage_ptr<S>(dout),
                           storage_ptr<S>(out), lse.data_as<A>(), storage_ptr<S>(q), storage_ptr<S>(k),
                           storage_ptr<S>(v), d, mask == BlockMask::Causal);
  });
}

}  // namespace mt::kernels
