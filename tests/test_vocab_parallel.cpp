// Tests of the vocab-parallel cross-entropy steps (kernels/vocab_parallel.h). tp ranks are simulated in one
// process: a [N, Vp] logits matrix is split into tp column shards, step 1 runs on each shard, the MAX all-reduce is
// done by hand, then step 2, the SUM all-reduce by hand, then step 3; the result is compared with the unsharded
// kernel softmax_xent_forward_backward (kernels/crossentropy.h), checked by central differences in fp64, and run in
// fp32 against fp64. Vocabularies not divisible by tp (padding in the last shard, or whole padding shards) and
// garbage in the padding columns are covered.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "kernels/crossentropy.h"
#include "kernels/vocab_parallel.h"
#include "test_support.h"

using namespace mt;
using namespace mt::kernels;

namespace {

Tensor f64(Shape s) { return Tensor::empty(s, DType::F64); }

void fill_normal(const Tensor& t, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  double* p = t.data_as<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = scale * nd(rng);
}

Tensor convert(const Tensor& t, DType dt) {
  Tensor r = Tensor::empty(t.shape(), dt);
  copy_convert(r, t);
  return r;
}
Tensor to64(const Tensor& t) { return t.dtype() == DType::F64 ? t : convert(t, DType::F64); }
Tensor clone(const Tensor& t) { return convert(t, t.dtype()); }

Tensor make_targets(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::I32);
  for (size_t i = 0; i < v.size(); ++i) t.data_as<int32_t>()[i] = v[i];
  return t;
}

// Largest |a - b| / (atol + rtol * |b|) over the elements: <= 1 means they agree.
double max_err(const Tensor& a, const Tensor& b, double rtol, double atol) {
  REQUIRE(a.numel() == b.numel());
  Tensor a64 = to64(a), b64 = to64(b);
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a64.data_as<double>()[i], y = b64.data_as<double>()[i];
    worst = std::max(worst, std::abs(x - y) / (atol + rtol * std::abs(y)));
  }
  return worst;
}

// Bitwise equality (NaN-free tensors).
bool same(const Tensor& a, const Tensor& b) { return a.numel() == b.numel() && max_err(a, b, 0, 1e-300) == 0; }

// Column shards of a [N, Vp] fp64 matrix, converted to dtype dt: shard r holds columns [r Vl, (r + 1) Vl).
std::vector<Tensor> split_columns(const Tensor& full, int tp, DType dt) {
  const int64_t N = full.dim(0), Vp = full.dim(1), Vl = Vp / tp;
  REQUIRE(Vl * tp == Vp);
  std::vector<Tensor> shards;
  for (int r = 0; r < tp; ++r) {
    Tensor s = f64({N, Vl});
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < Vl; ++j) s.data_as<double>()[n * Vl + j] = full.data_as<double>()[n * Vp + r * Vl + j];
    shards.push_back(dt == DType::F64 ? s : convert(s, dt));
  }
  return shards;
}

// The inverse of split_columns, in fp64.
Tensor join_columns(const std::vector<Tensor>& shards) {
  const int64_t N = shards[0].dim(0), Vl = shards[0].dim(1), tp = int64_t(shards.size()), Vp = Vl * tp;
  Tensor full = f64({N, Vp});
  for (int64_t r = 0; r < tp; ++r) {
    Tensor s = to64(shards[r]);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < Vl; ++j) full.data_as<double>()[n * Vp + r * Vl + j] = s.data_as<double>()[n * Vl + j];
  }
  return full;
}

// What the tp all-reduces leave in every rank's buffer: the elementwise max or sum over the ranks, in rank order.
template <typename T>
void all_reduce_by_hand(const std::vector<Tensor>& bufs, bool max) {
  const int64_t n = bufs[0].numel();
  for (int64_t i = 0; i < n; ++i) {
    T acc = bufs[0].data_as<T>()[i];
    for (size_t r = 1; r < bufs.size(); ++r) {
      const T x = bufs[r].data_as<T>()[i];
      acc = max ? std::max(acc, x) : acc + x;
    }
    for (const Tensor& b : bufs) b.data_as<T>()[i] = acc;
  }
}

struct Run {
  Tensor losses;                         // rank 0's (every rank's are checked to be identical)
  std::vector<Tensor> local_max, local_stats;  // each rank's buffers before its all-reduce
  std::vector<Tensor> global_max, global_stats;
};

// The three steps on every shard with the two reductions in between, as the model runs them over tp ranks.
// dshards: empty (losses only) or one gradient tensor per shard (may be the shards themselves: in place).
Run run_sharded(const std::vector<Tensor>& shards, const std::vector<Tensor>& dshards, const Tensor& targets,
                int64_t vocab, double dloss, DType loss_dtype = DType::F64) {
  const int tp = int(shards.size());
  const int64_t N = shards[0].dim(0), Vl = shards[0].dim(1);
  const DType dt = shards[0].dtype();
  Run out;
  std::vector<Tensor> mx, st;
  for (int r = 0; r < tp; ++r) {
    mx.push_back(Tensor::empty({N}, dt));
    vocab_parallel_xent_local_max(mx[r], shards[r], r * Vl, vocab);
    out.local_max.push_back(clone(mx[r]));
  }
  dt == DType::F64 ? all_reduce_by_hand<double>(mx, true) : all_reduce_by_hand<float>(mx, true);
  for (int r = 0; r < tp; ++r) {
    st.push_back(Tensor::empty({2, N}, dt));
    vocab_parallel_xent_local_sums(st[r], shards[r], targets, mx[r], r * Vl, vocab);
    out.local_stats.push_back(clone(st[r]));
  }
  dt == DType::F64 ? all_reduce_by_hand<double>(st, false) : all_reduce_by_hand<float>(st, false);
  for (int r = 0; r < tp; ++r) {
    Tensor losses = Tensor::empty({N}, loss_dtype);
    vocab_parallel_xent_finish(losses, dshards.empty() ? Tensor() : dshards[r], shards[r], targets, mx[r], st[r],
                               r * Vl, vocab, dloss);
    if (r == 0) out.losses = losses;
    else REQUIRE(same(losses, out.losses));
  }
  out.global_max = mx, out.global_stats = st;
  return out;
}

std::vector<Tensor> empty_like(const std::vector<Tensor>& ts) {
  std::vector<Tensor> r;
  for (const Tensor& t : ts) r.push_back(Tensor::empty(t.shape(), t.dtype()));
  return r;
}

// Writes garbage into the padding columns [vocab, Vp) of a [N, Vp] fp64 matrix: huge values of both signs,
// infinities and NaN, none of which may reach the loss or the gradient.
void fill_padding_garbage(const Tensor& full, int64_t vocab) {
  const int64_t N = full.dim(0), Vp = full.dim(1);
  const double junk[] = {1e300, -1e300, std::numeric_limits<double>::infinity(),
                         -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(), 1e3};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = vocab; v < Vp; ++v) full.data_as<double>()[n * Vp + v] = junk[(n + v) % 6];
}

bool any_nan(const Tensor& t) {
  Tensor t64 = to64(t);
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::isnan(t64.data_as<double>()[i])) return true;
  return false;
}

}  // namespace

// Tolerances against the unsharded kernel (fp64): the only difference is the order of the sum of exp over the
// vocabulary (per shard, then across shards, instead of one vectorised sum), a relative change of a few 1e-16 in
// sum_exp. Losses are log(sum_exp) + max - target (|loss| <~ 15 here), so they agree to 1e-14 absolute; gradients
// are p * dloss with p scaled by 1 / sum_exp, so they agree to 1e-14 relative (+1e-17 absolute for entries near 0
// and the target's p - 1 cancellation). Any indexing or masking bug gives differences of order 1e-3 .. 1.
TEST_CASE("vocab_parallel_xent: tp = 1, 2, 4 match the unsharded kernel, vocab divisible or padded",
          "[vocab_parallel]") {
  const int64_t N = 8, Vp = 256;
  const double dloss = 0.37;
  for (int64_t vocab : {int64_t(256), int64_t(250)}) {
    // With tp = 4 (Vl = 64) every rank owns two targets; 249 is the last real column when vocab = 250.
    Tensor targets = make_targets({0, 63, 64, 127, 128, 191, 192, int32_t(vocab - 1)});
    Tensor logits = f64({N, Vp});
    fill_normal(logits, 7, 3.0);
    fill_padding_garbage(logits, vocab);  // no-op when vocab == Vp
    Tensor ref_losses = f64({N}), ref_d = f64({N, Vp});
    softmax_xent_forward_backward(ref_losses, ref_d, logits, targets, vocab, dloss);
    for (int tp : {1, 2, 4}) {
      INFO("vocab " << vocab << ", tp " << tp);
      std::vector<Tensor> shards = split_columns(logits, tp, DType::F64), d = empty_like(shards);
      for (const Tensor& t : d) fill_normal(t, 3, 100.0);  // overwritten, padding included
      Run run = run_sharded(shards, d, targets, vocab, dloss);
      REQUIRE(max_err(run.losses, ref_losses, 0, 1e-14) <= 1);
      Tensor full_d = join_columns(d);
      REQUIRE(!any_nan(full_d));
      REQUIRE(max_err(full_d, ref_d, 1e-14, 1e-17) <= 1);
      for (int64_t n = 0; n < N; ++n)  // padding gradient is exactly 0
        for (int64_t v = vocab; v < Vp; ++v) REQUIRE(full_d.data_as<double>()[n * Vp + v] == 0.0);

      // In place (dlogits aliasing logits), and fp32 losses from fp64 logits, give the same result.
      std::vector<Tensor> inplace;
      for (const Tensor& s : shards) inplace.push_back(clone(s));
      Run run2 = run_sharded(inplace, inplace, targets, vocab, dloss, DType::F32);
      REQUIRE(same(join_columns(inplace), full_d));
      REQUIRE(same(run2.losses, convert(run.losses, DType::F32)));
    }
  }
}

TEST_CASE("vocab_parallel_xent: padding garbage changes nothing and gets zero gradient", "[vocab_parallel]") {
  const int64_t N = 8, Vp = 256, vocab = 250, tp = 4;  // the last shard holds 58 real and 6 padding columns
  Tensor targets = make_targets({3, 249, 64, 200, 192, 10, 130, 248});
  Tensor clean = f64({N, Vp});
  fill_normal(clean, 11, 2.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = vocab; v < Vp; ++v) clean.data_as<double>()[n * Vp + v] = 0.0;
  Tensor dirty = clone(clean);
  fill_padding_garbage(dirty, vocab);
  std::vector<Tensor> sc = split_columns(clean, tp, DType::F64), sd = split_columns(dirty, tp, DType::F64);
  std::vector<Tensor> dc = empty_like(sc), dd = empty_like(sd);
  for (int r = 0; r < tp; ++r) fill_normal(dc[r], 40 + r, 100.0), fill_normal(dd[r], 50 + r, 100.0);  // overwritten
  Run rc = run_sharded(sc, dc, targets, vocab, 1.0 / N), rd = run_sharded(sd, dd, targets, vocab, 1.0 / N);
  REQUIRE(same(rd.losses, rc.losses));
  REQUIRE(!any_nan(join_columns(dd)));
  REQUIRE(same(join_columns(dd), join_columns(dc)));
  for (int r = 0; r < tp; ++r) {  // the local buffers too: padding never reaches them
    REQUIRE(same(rd.local_max[r], rc.local_max[r]));
    REQUIRE(same(rd.local_stats[r], rc.local_stats[r]));
  }
  const Tensor& last = dd[tp - 1];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = vocab - (tp - 1) * (Vp / tp); j < Vp / tp; ++j)
      REQUIRE(last.data_as<double>()[n * (Vp / tp) + j] == 0.0);
}

TEST_CASE("vocab_parallel_xent: each rank's partial buffers and a rank that owns only padding", "[vocab_parallel]") {
  // vocab 90 over Vp 128, tp 4 (Vl 32): rank 2 holds 26 real columns, rank 3 none. Targets on ranks 0, 1, 2.
  const int64_t N = 6, Vp = 128, vocab = 90, tp = 4, Vl = Vp / tp;
  const std::vector<int32_t> tg = {0, 31, 32, 63, 64, 89};
  Tensor targets = make_targets(tg), logits = f64({N, Vp});
  fill_normal(logits, 5, 2.0);
  fill_padding_garbage(logits, vocab);
  std::vector<Tensor> shards = split_columns(logits, tp, DType::F64), d = empty_like(shards);
  for (const Tensor& t : d) fill_normal(t, 9, 100.0);
  const double dloss = 0.5;
  Run run = run_sharded(shards, d, targets, vocab, dloss);
  const double* L = logits.data_as<double>();
  for (int r = 0; r < tp; ++r) {
    const int64_t v0 = r * Vl, v1 = std::min(vocab, v0 + Vl);
    for (int64_t n = 0; n < N; ++n) {
      INFO("rank " << r << ", row " << n);
      double mx = -std::numeric_limits<double>::infinity(), z = 0;
      for (int64_t v = v0; v < v1; ++v) mx = std::max(mx, L[n * Vp + v]);
      REQUIRE(run.local_max[r].data_as<double>()[n] == mx);  // -inf on rank 3
      const double gmx = run.global_max[r].data_as<double>()[n];
      for (int64_t v = v0; v < v1; ++v) z += std::exp(L[n * Vp + v] - gmx);
      const double* st = run.local_stats[r].data_as<double>();
      REQUIRE(std::abs(st[n] - z) <= 1e-14 * std::max(1.0, z));  // 0 exactly on rank 3
      const bool owner = tg[n] >= v0 && tg[n] < v0 + Vl;
      REQUIRE(st[N + n] == (owner ? L[n * Vp + tg[n]] : 0.0));
    }
  }
  for (int64_t i = 0; i < N * Vl; ++i) REQUIRE(d[3].data_as<double>()[i] == 0.0);
  Tensor ref_losses = f64({N}), ref_d = f64({N, Vp});
  softmax_xent_forward_backward(ref_losses, ref_d, logits, targets, vocab, dloss);
  REQUIRE(max_err(run.losses, ref_losses, 0, 1e-14) <= 1);
  REQUIRE(max_err(join_columns(d), ref_d, 1e-14, 1e-17) <= 1);
}

// Central differences of L = dloss * sum_n losses[n], computed through the whole sharded pipeline (forward only),
// with respect to every element of every shard, padding included (its numeric gradient is 0). Tolerance as in gradcheck
// (tests/test_support.h): with h = 1e-6 * max(1, |x|) the truncation error is O(h^2 |L'''|) ~ 1e-12 and the rounding
// error O(eps |L| / h) ~ 2e-16 * 20 / 1e-6 = 4e-9 (L ~ 4 rows * 0.5 * ~6), so |numeric - analytic| <=
// 1e-6 * max(1, |analytic|) holds with a wide margin, while a wrong gradient is off by 1e-3 .. 1.
TEST_CASE("vocab_parallel_xent: finite-difference gradient of the sharded loss (fp64, tp 4, vocab 250)",
          "[vocab_parallel]") {
  const int64_t N = 4, Vp = 256, vocab = 250, tp = 4;
  Tensor targets = make_targets({5, 100, 249, 180}), logits = f64({N, Vp});
  fill_normal(logits, 21, 2.0);
  for (int64_t n = 0; n < N; ++n)  // finite padding values, so perturbing them is meaningful
    for (int64_t v = vocab; v < Vp; ++v) logits.data_as<double>()[n * Vp + v] = 5.0 * ((n + v) % 3) - 4.0;
  const double dloss = 0.5;
  std::vector<Tensor> shards = split_columns(logits, tp, DType::F64), d = empty_like(shards);
  run_sharded(shards, d, targets, vocab, dloss);
  auto loss = [&] {
    Run r = run_sharded(shards, {}, targets, vocab, dloss);
    double s = 0;
    for (int64_t n = 0; n < N; ++n) s += dloss * r.losses.data_as<double>()[n];
    return s;
  };
  std::vector<mt::test::GradParam> params;
  for (int r = 0; r < tp; ++r) params.push_back({"shard " + std::to_string(r), shards[r], d[r]});
  mt::test::gradcheck(loss, params);
}

// fp32 sharded against the fp64 unsharded kernel, at a size that takes the multithreaded paths (N * Vl > 2^14).
// Tolerances as for the unsharded fp32 kernel (test_kernels.cpp): sums of ~1000 fp32 terms, ~1e-6 relative.
TEST_CASE("vocab_parallel_xent: fp32 agrees with fp64 (many rows, wide vocabulary)", "[vocab_parallel]") {
  const int64_t N = 96, Vp = 1024, vocab = 1000;
  std::vector<int32_t> tg(N);
  for (int64_t n = 0; n < N; ++n) tg[n] = int32_t((n * 37) % vocab);
  Tensor targets = make_targets(tg), logits = f64({N, Vp});
  fill_normal(logits, 31, 3.0);
  fill_padding_garbage(logits, vocab);
  Tensor ref_losses = f64({N}), ref_d = f64({N, Vp});
  softmax_xent_forward_backward(ref_losses, ref_d, logits, targets, vocab, 1.0 / N);
  for (int tp : {1, 4}) {
    INFO("tp " << tp);
    std::vector<Tensor> s32 = split_columns(logits, tp, DType::F32), s64 = split_columns(logits, tp, DType::F64);
    std::vector<Tensor> d64 = empty_like(s64);
    Run r32 = run_sharded(s32, s32, targets, vocab, 1.0 / N, DType::F32);  // in place
    Run r64 = run_sharded(s64, d64, targets, vocab, 1.0 / N);
    Tensor g32 = join_columns(s32);
    REQUIRE(!any_nan(g32));
    REQUIRE(max_err(r32.losses, ref_losses, 1e-5, 1e-5) <= 1);
    REQUIRE(max_err(g32, ref_d, 1e-4, 1e-9) <= 1);
    REQUIRE(max_err(r64.losses, ref_losses, 0, 1e-13) <= 1);
    REQUIRE(max_err(join_columns(d64), ref_d, 1e-13, 1e-17) <= 1);
  }
}
