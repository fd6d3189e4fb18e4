// comm.compress=topk: each rank sends the k entries of largest |gradient + residual| of a bucket (values and
// indices, one all_gather), every rank scatter-adds all of them and divides by p (grad_compress.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "parallel/grad_compress.h"

namespace mt {

namespace {

// |x| with NaN as +inf, so NaN entries are selected (and a non-finite gradient reaches the average) and the
// ordering stays a strict weak order.
float magnitude(float x) {
  const float a = std::fabs(x);
  return std::isnan(a) ? std::numeric_limits<float>::infinity() : a;
}

class TopkCompressor final : public BucketCompressor {
 public:
  TopkCompressor(Communicator& dp, const Tensor& grads, const Tensor& residual, double fraction,
                 std::shared_ptr<std::vector<float>> scratch)
      : dp_(dp), g_(grads), e_(residual), n_(grads.numel()), k_(topk_count(n_, fraction)),
        gathered_(Tensor::zeros({dp.size() * 2 * k_}, DType::I32)), scratch_(std::move(scratch)) {
    idx_.reserve(static_cast<size_t>(k_));
  }

  // x = g + e; this rank's segment of the gather buffer: [k values (fp32 bits) | k indices]; the residual
  // keeps x with the sent entries zeroed.
  void launch() override {
    float* g = g_.data_as<float>();
    float* e = e_.data_as<float>();
    for (int64_t i = 0; i < n_; ++i) g[i] += e[i];
    topk_select(g, n_, k_, *scratch_, idx_);
    int32_t* own = gathered_.data_as<int32_t>() + dp_.rank() * 2 * k_;
    std::memcpy(e, g, sizeof(float) * static_cast<size_t>(n_));
    for (int64_t j = 0; j < k_; ++j) {
      std::memcpy(own + j, g + idx_[j], sizeof(float));
      own[k_ + j] = idx_[j];
      e[idx_[j]] = 0.0f;
    }
    work_ = dp_.all_gather_async(gathered_.slice(dp_.rank() * 2 * k_, {2 * k_}), gathered_);
  }

  // average = (sum over ranks r, in rank order, of r's entries scattered into zeros) / p.
  void complete() override {
    work_->wait();
    work_.reset();
    float* g = g_.data_as<float>();
    std::fill(g, g + n_, 0.0f);
    for (int r = 0; r < dp_.size(); ++r) {
      const int32_t* seg = gathered_.data_as<int32_t>() + r * 2 * k_;
      for (int64_t j = 0; j < k_; ++j) {
        const int32_t i = seg[k_ + j];
        CHECK(i >= 0 && i < n_, "topk: rank {} sent index {} for a bucket of {} elements", r, i, n_);
        float v;
        std::memcpy(&v, seg + j, sizeof(float));
        g[i] += v;
      }
    }
    const float p = float(dp_.size());
    for (int64_t i = 0; i < n_; ++i) g[i] /= p;
  }

  void reset() override { zero_(e_); }
  int64_t wire_bytes() const override { return 8 * k_; }
  int64_t buffer_bytes() const override { return static_cast<int64_t>(gathered_.nbytes()) + 4 * k_; }

 private:
  Communicator& dp_;
  Tensor g_, e_;
  int64_t n_, k_;
  Tensor gathered_;  // I32, 2k words per rank in rank order
  std::shared_ptr<std::vector<float>> scratch_;
  std::vector<int32_t> idx_;
  WorkPtr work_;
};

}  // namespace

int64_t topk_count(int64_t n, double fraction) {
  if (n <= 0) return 0;
  const double want = fraction * double(n);
  const int64_t k = static_cast<int64_t>(std::ceil(want - 1e-9 * std::max(1.0, want)));
  return std::clamp<int64_t>(k, 1, n);
}

void topk_select(const float* x, int64_t n, int64_t k, std::vector<float>& scratch, std::vector<int32_t>& idx) {
  CHECK(n <= std::numeric_limits<int32_t>::max(), "topk: a bucket of {} elements needs 64-bit indices", n);
  idx.clear();
  if (k >= n) {
    for (int64_t i = 0; i < n; ++i) idx.push_back(static_cast<int32_t>(i));
    return;
  }
  if (k <= 0) return;
  // The k-th largest magnitude t; then every entry above t and, in index order, as many equal to t as fit.
  scratch.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) scratch[i] = magnitude(x[i]);
  std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(), std::greater<float>());
  const float t = scratch[k - 1];
  int64_t above = 0;
  for (int64_t i = 0; i < n; ++i) above += magnitude(x[i]) > t;
  int64_t ties = k - above;
  for (int64_t i = 0; i < n; ++i) {
    const float m = magnitude(x[i]);
    if (m > t || (m == t && ties-- > 0)) idx.push_back(static_cast<int32_t>(i));
  }
}

std::unique_ptr<BucketCompressor> make_topk_compressor(Communicator& dp, const Tensor& grads, const Tensor& residual,
                                                       double fraction,
                                                       std::shared_ptr<std::vector<float>> topk_scratch) {
  CHECK(fraction > 0 && fraction <= 1, "comm.topk_fraction must be in (0, 1], got {}", fraction);
  return std::make_unique<TopkCompressor>(dp, grads, residual, fraction, std::move(topk_scratch));
}

}  // namespace mt
