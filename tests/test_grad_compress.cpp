// Compressed data-parallel gradient reduction (comm.compress = int8 | topk | powersgd, and bf16 as a wire dtype):
// each method's average against the exact one within the bound it promises, error feedback (what a step does not
// send comes back later), the bytes each method puts on the wire, overlap with the backward pass, and recovery
// from a non-finite step. Every case works at any world size; compress_tests.cmake runs the executable on 2 and
// 3 ranks as well (3: averages that fp32 rounds). Inputs are functions of (rank, step, element), so every rank
// can compute every other rank's input and the exact average in double.
#include <catch2/catch.hpp>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <numeric>
#include <random>
#include <vector>

#include "comm/make_communicator.h"
#include "parallel/grad_buckets.h"
#include "parallel/grad_compress.h"

using namespace mt;

namespace {

constexpr double kU = 0x1p-24;  // fp32 unit roundoff: a rounded result is within kU * |value|

std::unique_ptr<Communicator> world() {
  CommOptions o;
  o.timeout_s = 60;  // a mismatched rank aborts the job instead of hanging CI
  return make_communicator(MPI_COMM_WORLD, "dp", o);
}

CompressOptions options(CompressMethod method, double fraction = 0.01, int rank = 4) {
  CompressOptions o;
  o.method = method;
  o.topk_fraction = fraction;
  o.powersgd_rank = rank;
  o.seed = 1234;
  return o;
}

// Three parameters (at 16-element aligned offsets 0, 304, 384), cut into two buckets of 384 and 501 elements
// (int8: a partial last block in each, and 501 codes do not fill whole words).
ParamTable vector_table() {
  ParamTable t;
  t.add("a", {300}, {300}, true);
  t.add("b", {77}, {77}, false);
  t.add("c", {501}, {501}, true);
  return t;
}
std::vector<Bucket> vector_buckets(const ParamTable& t) {
  return make_buckets_within(t, 0, t.total_numel(), 4, 600 * 4.0);
}

// PowerSGD's table: compressed matrices (w1, w2, w3 at rank 2), a 1-D bias and a matrix too small to be worth it
// ((3 + 4) * 2 >= 12), in two buckets: [w1 | b1] = [0, 512) and [w2 | tiny | w3] = [512, 1020) (offsets 0, 480,
// 512, 704, 720: 16-element aligned, so there are gaps no parameter covers).
ParamTable matrix_table() {
  ParamTable t;
  t.add("w1", {24, 20}, {24, 20}, true);
  t.add("b1", {20}, {20}, false);
  t.add("w2", {16, 12}, {16, 12}, true);
  t.add("tiny", {3, 4}, {3, 4}, true);
  t.add("w3", {10, 30}, {10, 30}, true);
  return t;
}
std::vector<Bucket> matrix_buckets(const ParamTable& t) {
  return make_buckets_within(t, 0, t.total_numel(), 4, 520 * 4.0);
}

// One step of the reducer: the last micro-batch's backward pass makes every gradient final, then finish().
void step(GradReducer& red, const Tensor& grads, const std::vector<float>& in) {
  std::copy(in.begin(), in.end(), grads.data_as<float>());
  red.begin_micro_batch(true);
  red.grads_ready(grads.numel());
  red.finish();
}

std::vector<float> values(const Tensor& t) {
  return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel());
}

// Every rank's copy of a rank-local fp32 tensor (rank q's at [q * n, (q + 1) * n)).
std::vector<float> gather(Communicator& dp, const Tensor& t) {
  Tensor out = Tensor::zeros({dp.size() * t.numel()}, DType::F32);
  Tensor in = Tensor::zeros({t.numel()}, DType::F32);
  copy_convert(in, t);
  dp.all_gather(in, out);
  return values(out);
}

// A gradient of the table's parameters: uniform in [-1, 1) times a magnitude that changes from one 256-block
// to the next (so the int8 scales differ); zero in the alignment gaps between parameters, as in a real
// gradient buffer (PowerSGD does not send them).
std::vector<float> random_input(const ParamTable& table, int rank, int step) {
  std::mt19937 rng(1000003u * uint32_t(rank) + 7919u * uint32_t(step));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(table.total_numel(), 0.0f);
  for (const ParamSpec& s : table.specs())
    for (int64_t i = s.offset; i < s.offset + s.numel(); ++i)
      x[i] = u(rng) * std::pow(10.0f, float((i / 256) % 3) - 1.0f);
  return x;
}

double max_abs(const std::vector<float>& x) {
  double m = 0;
  for (float v : x) m = std::max(m, double(std::fabs(v)));
  return m;
}

// Records the collectives of a communicator (from its communication thread).
struct Recorder {
  std::mutex mu;
  std::vector<CommEvent> events;
  explicit Recorder(Communicator& dp) : dp_(dp) {
    dp_.set_event_sink([this](const CommEvent& e) {
      std::lock_guard<std::mutex> lk(mu);
      events.push_back(e);
    });
  }
  ~Recorder() { dp_.set_event_sink({}); }
  int64_t bytes() {
    std::lock_guard<std::mutex> lk(mu);
    int64_t b = 0;
    for (const CommEvent& e : events) b += e.bytes;
    return b;
  }
  int count(const std::string& op) {
    std::lock_guard<std::mutex> lk(mu);
    return int(std::count_if(events.begin(), events.end(), [&](const CommEvent& e) { return e.op == op; }));
  }
  void clear() {
    std::lock_guard<std::mutex> lk(mu);
    events.clear();
  }
  Communicator& dp_;
};

// The identity error feedback keeps: over T steps, sum_t out_t + mean_q e_q = mean_q sum_t g_q,t, where out_t is
// the averaged output and e_q the residual of rank q after the last step. `tol` is the bound of each test.
void check_feedback_identity(Communicator& dp, const std::vector<double>& sum_out, const std::vector<double>& sum_in,
                             const Tensor& residual, double tol) {
  const int P = dp.size();
  const int64_t n = residual.numel();
  const std::vector<float> e = gather(dp, residual);
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    double mean_e = 0;
    for (int q = 0; q < P; ++q) mean_e += e[q * n + i];
    mean_e /= P;
    worst = std::max(worst, std::abs(sum_out[i] + mean_e - sum_in[i]));
  }
  INFO("worst violation " << worst << ", bound " << tol);
  CHECK(worst <= tol);
}

// Runs `steps` steps of random inputs and checks the error-feedback identity; returns the reducer's residual
// magnitude (so a test can see that something was held back).
double feedback_over_steps(Communicator& dp, const ParamTable& table, const std::vector<Bucket>& buckets,
                           const CompressOptions& o, int steps, double tol_per_step_and_magnitude) {
  const int P = dp.size(), r = dp.rank();
  const int64_t n = table.total_numel();
  Tensor grads = Tensor::zeros({n}, DType::F32);
  GradReducer red(dp, grads, buckets, false, DType::F32, table, o);
  std::vector<double> sum_out(n, 0), sum_in(n, 0);
  double A = 0;
  for (int s = 0; s < steps; ++s) {
    for (int q = 0; q < P; ++q) {
      const std::vector<float> x = random_input(table, q, s);
      A = std::max(A, max_abs(x));
      for (int64_t i = 0; i < n; ++i) sum_in[i] += double(x[i]) / P;
    }
    step(red, grads, random_input(table, r, s));
    for (int64_t i = 0; i < n; ++i) sum_out[i] += grads.data_as<float>()[i];
  }
  check_feedback_identity(dp, sum_out, sum_in, red.residual(), steps * tol_per_step_and_magnitude * A);
  return max_abs(values(red.residual()));
}

}  // namespace

// ---------------------------------------------------------------------------------------------------- int8

TEST_CASE("int8: the average within half a quantisation step of every rank's block scale", "[compress][int8]") {
  auto dp = world();
  const int P = dp->size(), r = dp->rank();
  const ParamTable table = vector_table();
  const int64_t n = table.total_numel();
  const std::vector<Bucket> buckets = vector_buckets(table);
  Tensor grads = Tensor::zeros({n}, DType::F32);
  GradReducer red(*dp, grads, buckets, false, DType::F32, table, options(CompressMethod::Int8));
  step(red, grads, random_input(table, r, 0));
  // Bound, per element in block B of its bucket, with amax_q = max |x_q| over B and s_q = fl(amax_q / 127):
  // rank q's code c = round(fl(x / s_q)) is within 1/2 + 127u of x / s_q, so |c s_q - x| <= s_q / 2 + u amax_q
  // (1 + u)^2, and the rounded product adds u |c s_q| <= u (amax_q + s_q / 2): |decoded - x| <= s_q / 2 + 2.1 u
  // amax_q. Summing P decoded values in fp32 and dividing by P adds at most (P + 1) u max_q amax_q.
  // So |out - mean_q x_q| <= mean_q (amax_q / 254) (1 + u) + (P + 4) u max_q amax_q.
  double worst_ratio = 0, worst_err = 0;
  for (const Bucket& k : buckets)
    for (int64_t lo = k.begin; lo < k.end; lo += kInt8Block) {
      const int64_t hi = std::min(k.end, lo + kInt8Block);
      double mean_amax = 0, max_amax = 0;
      std::vector<double> exact(hi - lo, 0.0);
      for (int q = 0; q < P; ++q) {
        const std::vector<float> x = random_input(table, q, 0);
        double amax = 0;
        for (int64_t i = lo; i < hi; ++i) {
          amax = std::max(amax, double(std::fabs(x[i])));
          exact[i - lo] += double(x[i]) / P;
        }
        mean_amax += amax / P;
        max_amax = std::max(max_amax, amax);
      }
      const double bound = mean_amax / 254 * (1 + kU) + (P + 4) * kU * max_amax;
      for (int64_t i = lo; i < hi; ++i) {
        const double err = std::abs(grads.data_as<float>()[i] - exact[i - lo]);
        worst_ratio = std::max(worst_ratio, err / bound);
        worst_err = std::max(worst_err, err);
      }
    }
  INFO("worst error " << worst_err << " = " << worst_ratio << " of the bound");
  CHECK(worst_ratio <= 1.0);
  CHECK(worst_err > 0);  // the values did go through int8
}

TEST_CASE("int8: integer gradients with a full-scale entry per block are sent exactly", "[compress][int8]") {
  auto dp = world();
  const int P = dp->size(), r = dp->rank();
  const ParamTable table = vector_table();
  const int64_t n = table.total_numel();
  const std::vector<Bucket> buckets = vector_buckets(table);
  // Rank q's element i: an integer in [-127, 127]; the first element of every block is 127, so every scale is
  // exactly 1 and every code is the value itself: the average of integers is exact up to the one rounding of
  // the division by P (none for P = 1, 2).
  auto input = [&](int q) {
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = float((i * 7 + q * 3) % 255 - 127);
    for (const Bucket& k : buckets)
      for (int64_t lo = k.begin; lo < k.end; lo += kInt8Block) x[lo] = 127;
    return x;
  };
  Tensor grads = Tensor::zeros({n}, DType::F32);
  GradReducer red(*dp, grads, buckets, false, DType::F32, table, options(CompressMethod::Int8));
  step(red, grads, input(r));
  std::vector<double> exact(n, 0.0);
  for (int q = 0; q < P; ++q) {
    const std::vector<float> x = input(q);
    for (int64_t i = 0; i < n; ++i) exact[i] += x[i];
  }
  for (int64_t i = 0; i < n; ++i) REQUIRE(grads.data_as<float>()[i] == float(exact[i] / P));
  CHECK(max_abs(values(red.residual())) == 0);
}

TEST_CASE("int8 error feedback: an entry rounded away in one step is sent in the next", "[compress][int8]") {
  auto dp = world();
  const ParamTable table = vector_table();
  const int64_t n = table.total_numel();
  Tensor grads = Tensor::zeros({n}, DType::F32);
  GradReducer red(*dp, grads, vector_buckets(table), false, DType::F32, table, options(CompressMethod::Int8));
  // The same input on every rank: 127 and 0.4 in the first block. The scale is 1, so 0.4 rounds to code 0.
  std::vector<float> x(n, 0.0f);
  x[0] = 127;
  x[1] = 0.4f;
  step(red, grads, x);
  CHECK(grads.data_as<float>()[0] == 127);
  CHECK(grads.data_as<float>()[1] == 0);
  CHECK(red.residual().data_as<float>()[1] == 0.4f);
  // Next step, no new gradient: the block is the residual alone, scale 0.4 / 127, code 127: 0.4 comes through.
  // The residual is off by the rounding of 0.4 / 127 and of the product (2u relative); the average adds the
  // roundings of a sum of P equal values and of the division (P <= 3: 3u more).
  step(red, grads, std::vector<float>(n, 0.0f));
  CHECK(grads.data_as<float>()[0] == 0);
  CHECK(std::abs(grads.data_as<float>()[1] - 0.4) <= 5 * kU * 0.4);
  CHECK(std::abs(red.residual().data_as<float>()[1]) <= 2 * kU * 0.4);
}

TEST_CASE("int8 error feedback: sent over steps plus residual equals the sum of the gradients", "[compress][int8]") {
  auto dp = world();
  const ParamTable table = vector_table();
  // Per step and element, fp32 rounding in g + e (u |x|), in e = x - decoded (u s / 2), in the decoded product
  // (u |x|) and in the decoder's sum over P ranks and division ((P + 1) u |x|), with |x| <= 2 max|g| (the
  // residual is at most half a scale step): at most (P + 4) * 2u max|g| per step; 16u covers P <= 4.
  const double held = feedback_over_steps(*dp, table, vector_buckets(table), options(CompressMethod::Int8), 6, 16 * kU);
  CHECK(held > 0);
}

// ---------------------------------------------------------------------------------------------------- topk

TEST_CASE("topk count and selection", "[compress][topk]") {
  CHECK(topk_count(300, 0.01) == 3);  // 0.01 * 300 is 3.0000000000000004 in binary: not rounded up to 4
  CHECK(topk_count(384, 0.01) == 4);
  CHECK(topk_count(501, 0.01) == 6);
  CHECK(topk_count(10, 1.0) == 10);
  CHECK(topk_count(5, 1e-9) == 1);
  CHECK(topk_count(0, 0.5) == 0);
  std::vector<float> scratch;
  std::vector<int32_t> idx;
  const std::vector<float> x = {0.5f, -3.0f, 1.0f, 3.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), 0.0f};
  topk_select(x.data(), 7, 2, scratch, idx);
  CHECK(idx == std::vector<int32_t>{1, 5});  // NaN counts as infinite; |-3| = |3|: the lower index wins
  topk_select(x.data(), 7, 3, scratch, idx);
  CHECK(idx == std::vector<int32_t>{1, 3, 5});
  topk_select(x.data(), 7, 4, scratch, idx);  // |1| = |-1|: the lower index wins the last place
  CHECK(idx == std::vector<int32_t>{1, 2, 3, 5});
}

TEST_CASE("topk with fraction 1 equals the plain average", "[compress][topk]") {
  auto dp = world();
  const int P = dp->size(), r = dp->rank();
  const ParamTable table = vector_table();
  const int64_t n = table.total_numel();
  // Rank-valued inputs (i % 13 - 6 + q) / 8: small multiples of 1/8 whose sums are exact in fp32, so the
  // average is the exact sum divided by P, rounded once, whatever the order of the additions.
  auto input = [&](int q) {
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = float((i % 13 - 6 + q) / 8.0);
    return x;
  };
  Tensor grads = Tensor::zeros({n}, DType::F32), plain = Tensor::zeros({n}, DType::F32);
  GradReducer red(*dp, grads, vector_buckets(table), false, DType::F32, table, options(CompressMethod::TopK, 1.0));
  GradReducer ref(*dp, plain, vector_buckets(table), false);
  for (int s = 0; s < 2; ++s) {  // the second step shows that nothing was held back
    step(red, grads, input(r));
    step(ref, plain, input(r));
    for (int64_t i = 0; i < n; ++i) {
      double exact = 0;
      for (int q = 0; q < P; ++q) exact += (i % 13 - 6 + q) / 8.0;
      REQUIRE(grads.data_as<float>()[i] == float(exact / P));
      REQUIRE(grads.data_as<float>()[i] == plain.data_as<float>()[i]);
    }
    CHECK(max_abs(values(red.residual())) == 0);
  }
}

TEST_CASE("topk: every rank's largest entries scatter-added and divided by the group size", "[compress][topk]") {
  auto dp = world();
  const int P = dp->size(), r = dp->rank();
  const ParamTable table = vector_table();
  const int64_t n = table.total_numel();
  const std::vector<Bucket> buckets = vector_buckets(table);
  const double f = 0.05;
  Tensor grads = Tensor::zeros({n}, DType::F32);
  GradReducer red(*dp, grads, buckets, false, DType::F32, table, options(CompressMethod::TopK, f));
  step(red, grads, random_input(table, r, 0));
  // Reference: per rank and bucket, sort by (|x| descending, index ascending) and keep the first k.
  std::vector<double> expect(n, 0.0);
  std::vector<bool> mine(n, false);
  for (int q = 0; q < P; ++q) {
    const std::vector<float> x = random_input(table, q, 0);
    for (const Bucket& k : buckets) {
      std::vector<int64_t> order(k.numel());
      std::iota(order.begin(), order.end(), k.begin);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
      for (int64_t j = 0; j < topk_count(k.numel(), f); ++j) {
        expect[order[j]] += x[order[j]];
        if (q == r) mine[order[j]] = true;
      }
    }
  }
  // The decoder sums at most P values in fp32 and divides by P: (P + 1) u of the largest input.
  const double A = 1.0 * 10, tol = (P + 1) * kU * A;  // inputs are at most 10 in magnitude
  const std::vector<float> x = random_input(table, r, 0);
  for (int64_t i = 0; i < n; ++i) {
    REQUIRE(std::abs(grads.data_as<float>()[i] - expect[i] / P) <= tol);
    // The residual is this rank's input where it did not send, zero where it did: exactly.
    REQUIRE(red.residual().data_as<float>()[i] == (mine[i] ? 0.0f : x[i]));
  }
}

TEST_CASE("topk error feedback: a small entry dropped in step 1 is sent in step 2", "[compress][topk]") {
  auto dp = world();
  ParamTable table;
  table.add("v", {8}, {8}, false);
  Tensor grads = Tensor::zeros({8}, DType::F32);
  GradReducer red(*dp, grads, make_buckets(table, 8, 4, 1e6), false, DType::F32, table,
                  options(CompressMethod::TopK, 0.125));
  // k = 1. The same input on every rank, so the average is that input's sent part.
  step(red, grads, {0, 0, 5, 0, 1, 0, 0, 0});
  CHECK(values(grads) == std::vector<float>{0, 0, 5, 0, 0, 0, 0, 0});
  CHECK(values(red.residual()) == std::vector<float>{0, 0, 0, 0, 1, 0, 0, 0});
  // Step 2: the new gradient alone would send 0.75 at [4] only if nothing else competed; with the residual,
  // 1 + 0.75 = 1.75 beats 0.5 and goes out; 0.5 waits in the residual.
  step(red, grads, {0, 0, 0.5f, 0, 0.75f, 0, 0, 0});
  CHECK(values(grads) == std::vector<float>{0, 0, 0, 0, 1.75f, 0, 0, 0});
  CHECK(values(red.residual()) == std::vector<float>{0, 0, 0.5f, 0, 0, 0, 0, 0});
}

TEST_CASE("topk error feedback: sent over steps plus residual equals the sum of the gradients", "[compress][topk]") {
  auto dp = world();
  const ParamTable table = vector_table();
  // Sent entries are exact copies of x = fl(g + e) and unsent ones stay in e exactly; what rounds is g + e
  // (u |x|, |x| <= steps * max|g|: an entry can wait several steps) and the decoder's sum and division
  // ((P + 1) u |x|). Per step at most (P + 2) u * steps * max|g|; with 6 steps and P <= 4, 36u per step.
  const double held =
      feedback_over_steps(*dp, table, vector_buckets(table), options(CompressMethod::TopK, 0.1), 6, 36 * kU);
  CHECK(held > 0);
}

// ---------------------------------------------------------------------------------------------------- powersgd

TEST_CASE("powersgd layout: which parameters are compressed", "[compress][powersgd]") {
  const ParamTable table = matrix_table();
  const std::vector<Bucket> buckets = matrix_buckets(table);
  REQUIRE(buckets.size() == 2);
  REQUIRE(buckets[0].end == 512);  // w1 (480) + b1 (20) + alignment
  const PowerSgdLayout a = powersgd_layout(table, buckets[0], 2);
  REQUIRE(a.matrices.size() == 1);
  CHECK(a.matrices[0].name == "w1");
  CHECK((a.matrices[0].rows == 24 && a.matrices[0].cols == 20 && a.matrices[0].offset == 0));
  CHECK((a.p_numel == 48 && a.q_numel == 40 && a.u_numel == 20));
  REQUIRE(a.uncompressed.size() == 1);
  CHECK((a.uncompressed[0].offset == 480 && a.uncompressed[0].numel == 20));
  const PowerSgdLayout b = powersgd_layout(table, buckets[1], 2);
  REQUIRE(b.matrices.size() == 2);  // w2 and w3; tiny is sent as it is
  CHECK((b.matrices[0].name == "w2" && b.matrices[0].offset == 0));
  CHECK((b.matrices[1].name == "w3" && b.matrices[1].offset == 720 - 512));
  CHECK((b.p_numel == 2 * (16 + 10) && b.q_numel == 2 * (12 + 30) && b.u_numel == 12));
  // At rank 7 w2 is not worth it ((16 + 12) * 7 >= 192) but w3 still is (40 * 7 < 300): w2 joins tiny in one
  // uncompressed range.
  const PowerSgdLayout c = powersgd_layout(table, buckets[1], 7);
  REQUIRE(c.matrices.size() == 1);
  REQUIRE(c.uncompressed.size() == 1);
  CHECK((c.uncompressed[0].offset == 0 && c.uncompressed[0].numel == 192 + 12));
}

TEST_CASE("powersgd orthonormalisation: dependent columns vanish, non-finite ones stay visible", "[compress][powersgd]") {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  const int64_t rows = 30;
  const int cols = 4;
  std::vector<float> a(rows * cols);
  for (float& v : a) v = nd(rng);
  for (int64_t i = 0; i < rows; ++i) a[i * cols + 2] = 2 * a[i * cols + 0] - a[i * cols + 1];  // in the span
  std::vector<bool> vanished;
  CHECK(orthonormalize_columns(a.data(), rows, cols, &vanished) == 1);
  CHECK(vanished == std::vector<bool>{false, false, true, false});
  // The rest orthonormal to fp32 accuracy (dots over 30 rows of values below 1: 1e-6 is ~20 u * 30 / 8).
  for (int i : {0, 1, 3})
    for (int j : {0, 1, 3}) {
      double d = 0;
      for (int64_t r = 0; r < rows; ++r) d += double(a[r * cols + i]) * a[r * cols + j];
      CHECK(std::abs(d - (i == j ? 1.0 : 0.0)) <= 1e-6);
    }
  for (int64_t r = 0; r < rows; ++r) CHECK(a[r * cols + 2] == 0);
  a[5 * cols + 1] = std::numeric_limits<float>::infinity();
  orthonormalize_columns(a.data(), rows, cols);
  CHECK(std::isnan(a[0 * cols + 1]));
}

// The matrix parameters of matrix_table(): rank q's gradient of a matrix is A (B + q C)^T, rank 2 with the
// column space of A on every rank (so the average has rank 2 as well); w3 is rank 1, (q + 1) u v^T, below the
// approximation's rank. The rest (b1, tiny) is rank-valued: small multiples of 1/8.
std::vector<float> low_rank_input(const ParamTable& table, int q) {
  std::vector<float> x(table.total_numel());
  std::mt19937 rng(99);  // the same factors on every rank
  std::normal_distribution<float> nd;
  for (const ParamSpec& s : table.specs()) {
    float* out = x.data() + s.offset;
    if (s.name == "b1" || s.name == "tiny") {
      for (int64_t i = 0; i < s.numel(); ++i) out[i] = float((i % 9 - 4 + q) / 8.0);
      continue;
    }
    const int64_t n = s.shape[0], m = s.shape[1];
    std::vector<float> A(n * 2), B(m * 2), C(m * 2);
    for (float& v : A) v = nd(rng);
    for (float& v : B) v = nd(rng);
    for (float& v : C) v = nd(rng);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j)
        out[i * m + j] = s.name == "w3" ? float((q + 1) * A[i * 2] * B[j * 2])
                                        : float(double(A[i * 2]) * (B[j * 2] + q * C[j * 2]) +
                                                double(A[i * 2 + 1]) * (B[j * 2 + 1] + q * C[j * 2 + 1]));
  }
  return x;
}

TEST_CASE("powersgd is exact on matrices of rank at most powersgd_rank", "[compress][powersgd]") {
  auto dp = world();
  const int P = dp->size(), r = dp->rank();
  const ParamTable table = matrix_table();
  const int64_t n = table.total_numel();
  Tensor grads = Tensor::zeros({n}, DType::F32);
  GradReducer red(*dp, grads, matrix_buckets(table), false, DType::F32, table,
                  options(CompressMethod::PowerSGD, 0.01, 2));
  std::vector<double> exact(n, 0.0);
  double A = 0;
  for (int q = 0; q < P; ++q) {
    const std::vector<float> x = low_rank_input(table, q);
    A = std::max(A, max_abs(x));
    for (int64_t i = 0; i < n; ++i) exact[i] += double(x[i]);  // exact in double: multiples of 1/8 or fp32 products
  }
  for (double& v : exact) v /= P;  // one rounding in double, far below fp32's
  // P^ spans the matrices' common column space, so P^ P^^T X = X for every rank's X: exact but for fp32 rounding
  // in X Q, the orthonormalisation, X^T P^ and P^ Q^T (inner dimensions <= 30: a few 1e-6 of the largest entry).
  // 1e-4 of the largest entry leaves room and still catches a lost component (of order 1).
  const double tol = 1e-4 * A;
  for (int s = 0; s < 3; ++s) {  // warm-started Qs, and w3's vanished second column redrawn each step
    INFO("step " << s);
    step(red, grads, low_rank_input(table, r));
    double worst = 0;
    for (const ParamSpec& sp : table.specs())
      for (int64_t i = sp.offset; i < sp.offset + sp.numel(); ++i) {
        const float got = grads.data_as<float>()[i];
        if (sp.name == "b1" || sp.name == "tiny")
          REQUIRE(got == float(exact[i]));  // all-reduced uncompressed: rank-valued sums are exact
        else
          worst = std::max(worst, std::abs(got - exact[i]));
      }
    INFO("worst error " << worst << " of entries up to " << A);
    CHECK(worst <= tol);
    CHECK(max_abs(values(red.residual())) <= tol);
  }
}

TEST_CASE("powersgd error feedback: the component a rank-1 step drops is sent in the next step", "[compress][powersgd]") {
  auto dp = world();
  ParamTable table;
  table.add("m", {12, 10}, {12, 10}, true);
  const int64_t n = 120;
  // M = 3 a1 b1^T + a2 b2^T (the same on every rank), approximated at rank 1: step 1 sends about the first
  // component, the residual (I - p p^T) M has rank 1, and step 2 (no new gradient) sends it whole.
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> a1(12), a2(12), b1(10), b2(10), M(n);
  for (auto* v : {&a1, &a2}) for (float& x : *v) x = nd(rng);
  for (auto* v : {&b1, &b2}) for (float& x : *v) x = nd(rng);
  for (int i = 0; i < 12; ++i)
    for (int j = 0; j < 10; ++j) M[i * 10 + j] = 3 * a1[i] * b1[j] + a2[i] * b2[j];
  Tensor grads = Tensor::zeros({n}, DType::F32);
  GradReducer red(*dp, grads, make_buckets(table, n, 4, 1e6), false, DType::F32, table,
                  options(CompressMethod::PowerSGD, 0.01, 1));
  step(red, grads, M);
  const std::vector<float> out1 = values(grads);
  double missing = 0;
  for (int64_t i = 0; i < n; ++i) missing = std::max(missing, double(std::fabs(out1[i] - M[i])));
  const double A = max_abs(M);
  CHECK(missing > 0.05 * A);  // step 1 did not send all of M
  step(red, grads, std::vector<float>(n, 0.0f));
  // fp32 rounding as in the exactness test: 1e-4 of the largest entry.
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(double(out1[i]) + grads.data_as<float>()[i] - M[i]));
  INFO("steps 1 + 2 against M: worst " << worst << ", entries up to " << A);
  CHECK(worst <= 1e-4 * A);
  CHECK(max_abs(values(red.residual())) <= 1e-4 * A);
}

TEST_CASE("powersgd error feedback: sent over steps plus residual equals the sum of the gradients", "[compress][powersgd]") {
  auto dp = world();
  const ParamTable table = matrix_table();
  // Full-rank random matrices, so every step holds something back. What the identity does not see: rounding
  // of g + e (u |x|), of the residual X - P^ Q_own^T and of the output P^ Q^T (inner dimension 2, terms of the
  // size of X: ~3u |x| each), and the difference between P^ (mean Q)^T and the mean of P^ Q_q^T (the Avg's
  // rounding, ~2u |x|). |x| stays below ~3 max|g| with a warm-started rank-2 approximation. 1e-5 max|g| per step
  // is ~170u, some 5x above that sum.
  const double held =
      feedback_over_steps(*dp, table, matrix_buckets(table), options(CompressMethod::PowerSGD, 0.01, 2), 5, 1e-5);
  CHECK(held > 0);
}

// ---------------------------------------------------------------------------------------------------- all methods

TEST_CASE("bytes on the wire per step match the documented formulas", "[compress][bytes]") {
  auto dp = world();
  const ParamTable vt = vector_table(), mtab = matrix_table();
  const int64_t nv = vt.total_numel(), nm = mtab.total_numel();
  struct Case {
    CompressMethod method;
    double f;
    int rank;
    bool matrices;
    int64_t bytes;  // per rank and step: the payload CommEvent::bytes counts (metrics.jsonl's comm_bytes)
    int collectives;
  };
  auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const std::vector<Case> cases = {
      {CompressMethod::None, 0, 0, false, 4 * nv, 2},   // all_reduce of each bucket in fp32
      {CompressMethod::BF16, 0, 0, false, 2 * nv, 2},   // in bf16
      // int8: one all_gather per bucket of ceil(n / 256) scales + ceil(n / 4) words of codes, 4 bytes each;
      // buckets of 384 and 501 elements
      {CompressMethod::Int8, 0, 0, false, 4 * (cdiv(384, 256) + cdiv(384, 4)) + 4 * (cdiv(501, 256) + cdiv(501, 4)), 2},
      // topk: one all_gather per bucket of k values and k indices, k = ceil(f n)
      {CompressMethod::TopK, 0.01, 0, false, 8 * (4 + 6), 2},
      {CompressMethod::TopK, 0.1, 0, false, 8 * (39 + 51), 2},
      // powersgd at rank 2: per bucket all_reduce(P) 4 r sum(rows), all_reduce(Q) 4 r sum(cols), uncompressed
      // all_reduce 4 u: bucket 0 (w1 24x20, b1 20), bucket 1 (w2 16x12, tiny 12 elements, w3 10x30); the
      // alignment gaps between parameters are not sent
      {CompressMethod::PowerSGD, 0, 2, true, 4 * (2 * (24 + 20) + 20) + 4 * (2 * (16 + 12 + 10 + 30) + 12), 6},
  };
  for (const Case& c : cases) {
    INFO(name_of(c.method) << " fraction " << c.f);
    const ParamTable& table = c.matrices ? mtab : vt;
    const int64_t n = c.matrices ? nm : nv;
    Tensor grads = Tensor::zeros({n}, DType::F32);
    GradReducer red(*dp, grads, c.matrices ? matrix_buckets(table) : vector_buckets(table), false, DType::F32, table,
                    options(c.method, c.f, c.rank));
    Recorder rec(*dp);
    for (int s = 0; s < 2; ++s) {  // the same every step
      rec.clear();
      step(red, grads, random_input(table, dp->rank(), s));
      CHECK(rec.bytes() == c.bytes);
      CHECK(int(rec.events.size()) == c.collectives);
    }
    CHECK(red.wire_bytes_per_step() == c.bytes);
  }
}

TEST_CASE("int8 and topk with tp: the parameters tp ranks hold copies of are encoded apart", "[compress][tp]") {
  // vector_table's layout, with a and c split over 2 tp ranks and b replicated: as two tp ranks would, the steps
  // differ in a's and c's values and share b's. b must come out as if it were a bucket of its own, on both tp ranks
  // alike (average and residual), over steps that carry the residual on.
  auto dp = world();
  ParamTable t;
  t.add("a", {600}, {600}, true, Shard{0, 2, 0});
  t.add("b", {77}, {77}, false);
  t.add("c", {1002}, {1002}, true, Shard{0, 2, 0});
  const std::vector<Bucket> buckets = vector_buckets(t);
  REQUIRE(buckets.size() == 2);
  const int64_t n = t.total_numel(), b0 = t[1].offset, nb = t[1].numel();
  REQUIRE(b0 < buckets[0].end);  // b shares bucket 0 with a
  ParamTable alone;
  alone.add("b", {77}, {77}, false);
  for (CompressMethod method : {CompressMethod::Int8, CompressMethod::TopK}) {
    INFO(name_of(method));
    CompressOptions o = options(method, 0.1);
    o.tp_copies_apart = true;
    Tensor b_grads = Tensor::zeros({nb}, DType::F32);
    GradReducer b_red(*dp, b_grads, {Bucket{0, nb}}, false, DType::F32, alone, options(method, 0.1));
    Tensor grads[2] = {Tensor::zeros({n}, DType::F32), Tensor::zeros({n}, DType::F32)};
    std::unique_ptr<GradReducer> red[2];
    for (int tp_rank = 0; tp_rank < 2; ++tp_rank)
      red[tp_rank] = std::make_unique<GradReducer>(*dp, grads[tp_rank], buckets, false, DType::F32, t, o);
    for (int s = 0; s < 3; ++s) {
      INFO("step " << s);
      std::vector<float> in = random_input(t, dp->rank(), s);
      step(b_red, b_grads, std::vector<float>(in.begin() + b0, in.begin() + b0 + nb));
      const std::vector<float> b_avg = values(b_grads), b_e = values(b_red.residual());
      for (int tp_rank = 0; tp_rank < 2; ++tp_rank) {
        INFO("tp rank " << tp_rank);
        const std::vector<float> other = random_input(t, dp->rank() + 100, s + 10);
        std::vector<float> mine = in;
        for (int64_t i = 0; i < n; ++i)
          if (tp_rank == 1 && (i < b0 || i >= b0 + nb)) mine[i] = other[i];  // a and c: the other tp rank's shards
        Recorder rec(*dp);
        step(*red[tp_rank], grads[tp_rank], mine);
        const std::vector<float> out = values(grads[tp_rank]), e = values(red[tp_rank]->residual());
        CHECK(std::equal(b_avg.begin(), b_avg.end(), out.begin() + b0));  // bit for bit, so the copies stay equal
        CHECK(std::equal(b_e.begin(), b_e.end(), e.begin() + b0));
        CHECK(max_abs(b_e) > 0);  // b is compressed, not sent as it is
        CHECK(int(rec.events.size()) == 3);  // each bucket's message, and bucket 0's copies' message
        CHECK(rec.bytes() == red[tp_rank]->wire_bytes_per_step());
      }
    }
  }
}

TEST_CASE("every rank ends with the same averaged gradients bit for bit", "[compress][replicas]") {
  // Replicas must not drift: int8 and topk decode the same gathered data in the same order on every rank;
  // powersgd's P^ and Q come from all-reduces, whose results MPI gives every rank alike.
  auto dp = world();
  const int P = dp->size(), r = dp->rank();
  for (CompressMethod method : {CompressMethod::Int8, CompressMethod::TopK, CompressMethod::PowerSGD}) {
    INFO(name_of(method));
    const bool mat = method == CompressMethod::PowerSGD;
    const ParamTable table = mat ? matrix_table() : vector_table();
    const int64_t n = table.total_numel();
    Tensor grads = Tensor::zeros({n}, DType::F32);
    GradReducer red(*dp, grads, mat ? matrix_buckets(table) : vector_buckets(table), false, DType::F32, table,
                    options(method, 0.1, 2));
    for (int s = 0; s < 3; ++s) {
      step(red, grads, random_input(table, r, s));
      const std::vector<float> all = gather(*dp, grads);
      for (int q = 1; q < P; ++q)
        REQUIRE(std::equal(all.begin(), all.begin() + n, all.begin() + q * n));
    }
  }
}

TEST_CASE("compress=bf16 is the bf16 wire path and keeps no state", "[compress][bytes]") {
  auto dp = world();
  const ParamTable table = vector_table();
  Tensor grads = Tensor::zeros({table.total_numel()}, DType::F32);
  GradReducer red(*dp, grads, vector_buckets(table), false, DType::F32, table, options(CompressMethod::BF16));
  CHECK(red.wire_dtype() == DType::BF16);
  CHECK(red.compress_method() == CompressMethod::BF16);
  CHECK_FALSE(red.residual().defined());
  CHECK(red.compress_state_bytes() == 0);
}

TEST_CASE("compressed buckets launch from the backward pass's hook, and only on the last micro-batch", "[compress][overlap]") {
  auto dp = world();
  for (CompressMethod method : {CompressMethod::Int8, CompressMethod::TopK, CompressMethod::PowerSGD}) {
    INFO(name_of(method));
    const bool mat = method == CompressMethod::PowerSGD;
    const ParamTable table = mat ? matrix_table() : vector_table();
    const std::vector<Bucket> buckets = mat ? matrix_buckets(table) : vector_buckets(table);
    const int64_t n = table.total_numel();
    const std::string first = mat ? "all_reduce" : "all_gather";
    const int per_bucket = mat ? 2 : 1;  // powersgd: P and the uncompressed elements go out at launch
    Tensor grads = Tensor::zeros({n}, DType::F32);
    GradReducer red(*dp, grads, buckets, false, DType::F32, table, options(method, 0.1, 2));
    Recorder rec(*dp);
    // A micro-batch that is not the last: nothing is sent and nothing touched.
    const std::vector<float> x = random_input(table, dp->rank(), 0);
    std::copy(x.begin(), x.end(), grads.data_as<float>());
    red.begin_micro_batch(false);
    red.grads_ready(n);
    dp->barrier();  // queued behind anything issued before it, so its completion flushes the events
    CHECK(rec.count(first) == 0);
    CHECK(values(grads) == x);
    // The last one: bucket 0's first collectives go out as soon as its gradients are final.
    red.begin_micro_batch(true);
    red.grads_ready(buckets[0].end);
    dp->barrier();
    CHECK(rec.count(first) == per_bucket);
    red.grads_ready(n);
    red.finish();
    CHECK(rec.count(first) == (mat ? 3 * 2 : 2));  // powersgd: Q's all-reduces in finish()
  }
}

TEST_CASE("after a non-finite step the error feedback is cleared and the next step is clean", "[compress][nonfinite]") {
  auto dp = world();
  const int r = dp->rank();
  for (CompressMethod method : {CompressMethod::Int8, CompressMethod::TopK, CompressMethod::PowerSGD}) {
    INFO(name_of(method));
    const bool mat = method == CompressMethod::PowerSGD;
    const ParamTable table = mat ? matrix_table() : vector_table();
    const std::vector<Bucket> buckets = mat ? matrix_buckets(table) : vector_buckets(table);
    const int64_t n = table.total_numel();
    Tensor grads = Tensor::zeros({n}, DType::F32), fresh_grads = Tensor::zeros({n}, DType::F32);
    GradReducer red(*dp, grads, buckets, false, DType::F32, table, options(method, 0.1, 2));
    step(red, grads, random_input(table, r, 0));
    CHECK(max_abs(values(red.residual())) > 0);
    // Step 2: an inf on rank 0 (an fp16 overflow): every rank's average is non-finite, and so is rank 0's
    // residual (but under topk, which sends the inf itself), until the trainer, whose optimizer skips the step,
    // clears the error feedback.
    std::vector<float> bad = random_input(table, r, 1);
    if (r == 0) bad[5] = std::numeric_limits<float>::infinity();
    step(red, grads, bad);
    CHECK_FALSE(all_finite(grads));
    if (r == 0 && method != CompressMethod::TopK) CHECK_FALSE(all_finite(red.residual()));
    red.reset_feedback();
    CHECK(max_abs(values(red.residual())) == 0);
    // Step 3 is finite; int8 and topk, whose only state is the residual, equal a fresh reducer's first step.
    step(red, grads, random_input(table, r, 2));
    CHECK(all_finite(grads));
    if (!mat) {
      GradReducer fresh(*dp, fresh_grads, buckets, false, DType::F32, table, options(method, 0.1, 2));
      step(fresh, fresh_grads, random_input(table, r, 2));
      CHECK(values(grads) == values(fresh_grads));
    }
  }
}
