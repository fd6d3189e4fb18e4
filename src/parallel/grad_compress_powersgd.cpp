// comm.compress=powersgd (Vogels, Karimireddy and Jaggi, "PowerSGD: practical low-rank gradient compression for
// distributed optimization", 2019; PyTorch's powerSGD DDP hook): one power-iteration step per parameter matrix
// with a warm-started Q, two all-reduces of the low-rank factors, and error feedback (grad_compress.h).
//
// Per bucket and step, for each compressed matrix X = gradient + residual (rows x cols, rank r):
//   launch    Q orthonormalised (columns that vanished redrawn); P = X Q; all_reduce(P, Sum) of all the bucket's
//             Ps in one buffer; the uncompressed elements copied into one buffer, all_reduce(Avg)
//   exchange  wait P; P^ = P with orthonormal columns (the same on every rank: it is the summed P);
//             Q_own = X^T P^; all_reduce(Q, Avg) of all the bucket's Qs; residual = X - P^ Q_own^T
//   complete  wait Q; X := P^ Q^T (= the average over ranks of P^ Q_own^T); the uncompressed average copied back
// Q (averaged, identical on every rank) is kept for the next step: the warm start.
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/philox.h"
#include "parallel/grad_buckets.h"
#include "parallel/grad_compress.h"

namespace mt {

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Map = Eigen::Map<RowMat>;

// A column below this fraction of its norm after the previous columns are projected out is numerically in their
// span: fp32 cancellation leaves about sqrt(rows) * 2^-24 of it, far below 1e-4 for any matrix we train.
constexpr double kVanish = 1e-4;

class PowerSgdCompressor final : public BucketCompressor {
 public:
  PowerSgdCompressor(Communicator& dp, const Tensor& grads, const Tensor& residual, PowerSgdLayout layout,
                     uint64_t seed)
      : dp_(dp), g_(grads), e_(residual), L_(std::move(layout)), seed_(seed),
        p_(Tensor::zeros({L_.p_numel}, DType::F32)), q_(Tensor::zeros({L_.q_numel}, DType::F32)),
        q_own_(Tensor::zeros({L_.q_numel}, DType::F32)), u_(Tensor::zeros({L_.u_numel}, DType::F32)),
        draws_(L_.matrices.size(), 0) {
    int64_t po = 0, qo = 0;
    for (const LowRankMatrix& m : L_.matrices) {
      p_off_.push_back(po);
      q_off_.push_back(qo);
      po += m.rows * m.rank;
      qo += m.cols * m.rank;
    }
    for (size_t i = 0; i < L_.matrices.size(); ++i) draw_q(i, std::vector<bool>(L_.matrices[i].rank, true));
  }

  void launch() override {
    for (size_t i = 0; i < L_.matrices.size(); ++i) {
      const LowRankMatrix& m = L_.matrices[i];
      float* x = g_.data_as<float>() + m.offset;
      const float* e = e_.data_as<float>() + m.offset;
      for (int64_t j = 0; j < m.rows * m.cols; ++j) x[j] += e[j];
      prepare_q(i);
      P(i).noalias() = X(i) * Q(i);
    }
    if (L_.p_numel > 0) work_p_ = dp_.all_reduce_async(p_, ReduceOp::Sum);  // scale-free: P is orthonormalised
    float* u = u_.data_as<float>();
    for (const ElementRange& r : L_.uncompressed) {
      std::memcpy(u, g_.data_as<float>() + r.offset, sizeof(float) * static_cast<size_t>(r.numel));
      u += r.numel;
    }
    if (L_.u_numel > 0) work_u_ = dp_.all_reduce_async(u_, ReduceOp::Avg);
  }

  void exchange() override {
    if (L_.matrices.empty()) return;
    wait(work_p_);
    for (size_t i = 0; i < L_.matrices.size(); ++i) {
      orthonormalize_columns(P(i).data(), L_.matrices[i].rows, L_.matrices[i].rank);
      Q(i).noalias() = X(i).transpose() * P(i);
    }
    std::memcpy(q_own_.data(), q_.data(), q_.nbytes());
    work_q_ = dp_.all_reduce_async(q_, ReduceOp::Avg);
    // While Q travels: this rank's own decoded contribution is P^ Q_own^T; the residual keeps the rest.
    for (size_t i = 0; i < L_.matrices.size(); ++i) {
      Map e(e_.data_as<float>() + L_.matrices[i].offset, L_.matrices[i].rows, L_.matrices[i].cols);
      e = X(i);
      e.noalias() -= P(i) * Qown(i).transpose();
    }
  }

  void complete() override {
    if (!L_.matrices.empty()) {
      wait(work_q_);
      for (size_t i = 0; i < L_.matrices.size(); ++i) X(i).noalias() = P(i) * Q(i).transpose();
    }
    if (L_.u_numel > 0) {
      wait(work_u_);
      const float* u = u_.data_as<float>();
      for (const ElementRange& r : L_.uncompressed) {
        std::memcpy(g_.data_as<float>() + r.offset, u, sizeof(float) * static_cast<size_t>(r.numel));
        u += r.numel;
      }
    }
  }

  std::vector<LowRankState> low_rank_state() override {
    std::vector<LowRankState> out;
    for (size_t i = 0; i < L_.matrices.size(); ++i) {
      const LowRankMatrix& m = L_.matrices[i];
      out.push_back({m.name, q_.slice(q_off_[i], {m.cols * m.rank}), &draws_[i]});
    }
    return out;
  }

  void reset() override {
    zero_(e_);
    for (size_t i = 0; i < L_.matrices.size(); ++i) draw_q(i, std::vector<bool>(L_.matrices[i].rank, true));
  }

  int64_t wire_bytes() const override { return 4 * (L_.p_numel + L_.q_numel + L_.u_numel); }
  int64_t state_bytes() const override { return static_cast<int64_t>(q_.nbytes()); }
  int64_t buffer_bytes() const override { return static_cast<int64_t>(p_.nbytes() + q_own_.nbytes() + u_.nbytes()); }

 private:
  static void wait(WorkPtr& w) {
    w->wait();
    w.reset();
  }
  Map X(size_t i) const {
    const LowRankMatrix& m = L_.matrices[i];
    return Map(g_.data_as<float>() + m.offset, m.rows, m.cols);
  }
  Map P(size_t i) const { return Map(p_.data_as<float>() + p_off_[i], L_.matrices[i].rows, L_.matrices[i].rank); }
  Map Q(size_t i) const { return Map(q_.data_as<float>() + q_off_[i], L_.matrices[i].cols, L_.matrices[i].rank); }
  Map Qown(size_t i) const {
    return Map(q_own_.data_as<float>() + q_off_[i], L_.matrices[i].cols, L_.matrices[i].rank);
  }

  // Fills the chosen columns of matrix i's Q with standard normals keyed by (seed, its name, draw number): the
  // same on every rank of the group, and fresh at each redraw.
  void draw_q(size_t i, const std::vector<bool>& cols) {
    const LowRankMatrix& m = L_.matrices[i];
    const uint64_t stream = fnv1a64(m.name) + 0x9E3779B97F4A7C15ull * ++draws_[i];
    float* q = q_.data_as<float>() + q_off_[i];
    for (int64_t row = 0; row < m.cols; ++row)
      for (int c = 0; c < m.rank; ++c)
        if (cols[c]) q[row * m.rank + c] = float(philox_normal(seed_, stream, uint64_t(row * m.rank + c)));
  }

  // The warm-started Q with orthonormal columns. A column that vanished (a zero column of last step's P^, or a
  // direction its other columns already span) is redrawn, so the approximation never loses rank for good.
  void prepare_q(size_t i) {
    const LowRankMatrix& m = L_.matrices[i];
    std::vector<bool> vanished;
    for (int attempt = 0; attempt < 3; ++attempt) {
      if (orthonormalize_columns(q_.data_as<float>() + q_off_[i], m.cols, m.rank, &vanished) == 0) return;
      draw_q(i, vanished);
    }
  }

  Communicator& dp_;
  Tensor g_, e_;
  PowerSgdLayout L_;
  uint64_t seed_;
  Tensor p_, q_, q_own_, u_;  // all the bucket's Ps, Qs (the state), this rank's Qs, uncompressed elements
  std::vector<int64_t> p_off_, q_off_;
  std::vector<uint64_t> draws_;  // per matrix: how many times its Q was drawn (identical on every rank)
  WorkPtr work_p_, work_u_, work_q_;
};

}  // namespace

PowerSgdLayout powersgd_layout(const ParamTable& table, const Bucket& bucket, int rank) {
  CHECK(rank >= 1, "comm.powersgd_rank must be >= 1, got {}", rank);
  PowerSgdLayout L;
  auto uncompressed = [&](int64_t lo, int64_t hi) {  // absolute element range [lo, hi)
    if (hi <= lo) return;
    if (!L.uncompressed.empty() && L.uncompressed.back().offset + L.uncompressed.back().numel == lo - bucket.begin)
      L.uncompressed.back().numel += hi - lo;
    else
      L.uncompressed.push_back({lo - bucket.begin, hi - lo});
    L.u_numel += hi - lo;
  };
  // Elements between parameters (the table's 16-element alignment) hold no gradient: they are not sent.
  for (const ParamSpec& s : table.specs()) {
    const int64_t lo = std::max(s.offset, bucket.begin), hi = std::min(s.offset + s.numel(), bucket.end);
    if (lo >= hi) continue;
    const int64_t rows = s.shape.n >= 2 ? s.shape[0] : 0, cols = rows > 0 ? s.numel() / rows : 0;
    const bool whole = lo == s.offset && hi == s.offset + s.numel();  // a parameter cut by the bucket: uncompressed
    if (whole && rows > 0 && (rows + cols) * rank < rows * cols) {
      L.matrices.push_back({s.name, lo - bucket.begin, rows, cols, rank});
      L.p_numel += rows * rank;
      L.q_numel += cols * rank;
    } else {
      uncompressed(lo, hi);
    }
  }
  return L;
}

int orthonormalize_columns(float* a, int64_t rows, int cols, std::vector<bool>* vanished) {
  if (vanished) vanished->assign(cols, false);
  auto dot = [&](int i, int j) {
    double s = 0;
    for (int64_t r = 0; r < rows; ++r) s += double(a[r * cols + i]) * double(a[r * cols + j]);
    return s;
  };
  int zeroed = 0;
  std::vector<bool> live(cols, false);
  for (int j = 0; j < cols; ++j) {
    const double norm0 = std::sqrt(dot(j, j));
    if (!std::isfinite(norm0)) {  // keep the inf / NaN visible in the result
      for (int64_t r = 0; r < rows; ++r) a[r * cols + j] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    for (int pass = 0; pass < 2; ++pass)
      for (int i = 0; i < j; ++i) {
        if (!live[i]) continue;
        const double d = dot(i, j);
        for (int64_t r = 0; r < rows; ++r) a[r * cols + j] -= float(d * a[r * cols + i]);
      }
    const double norm1 = std::sqrt(dot(j, j));
    if (!(norm1 > kVanish * norm0) || norm1 == 0) {
      for (int64_t r = 0; r < rows; ++r) a[r * cols + j] = 0.0f;
      if (vanished) (*vanished)[j] = true;
      ++zeroed;
      continue;
    }
    for (int64_t r = 0; r < rows; ++r) a[r * cols + j] = float(a[r * cols + j] / norm1);
    live[j] = true;
  }
  return zeroed;
}

std::unique_ptr<BucketCompressor> make_powersgd_compressor(Communicator& dp, const Tensor& grads,
                                                           const Tensor& residual, PowerSgdLayout layout,
                                                           uint64_t seed) {
  return std::make_unique<PowerSgdCompressor>(dp, grads, residual, std::move(layout), seed);
}

}  // namespace mt
