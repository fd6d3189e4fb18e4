// comm.compress=int8: each bucket's (gradient + residual) quantised in blocks of kInt8Block elements to int8 with
// one fp32 scale per block, exchanged with one all_gather, dequantised and averaged locally (grad_compress.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "parallel/grad_compress.h"

namespace mt {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

class Int8Compressor final : public BucketCompressor {
 public:
  Int8Compressor(Communicator& dp, const Tensor& grads, const Tensor& residual)
      : dp_(dp), g_(grads), e_(residual), n_(grads.numel()), blocks_(ceil_div(n_, kInt8Block)),
        words_(int8_wire_words(n_)), gathered_(Tensor::zeros({dp.size() * words_}, DType::I32)), scales_(blocks_) {}

  // x = g + e (in the gradient buffer, which the average overwrites later), encoded into this rank's segment of
  // the gather buffer: [scales | codes]; the residual keeps x - decode(own codes).
  void launch() override {
    float* g = g_.data_as<float>();
    float* e = e_.data_as<float>();
    int32_t* own = gathered_.data_as<int32_t>() + dp_.rank() * words_;
    unsigned char* codes = reinterpret_cast<unsigned char*>(own + blocks_);  // unsigned char may alias anything
    int8_t q[kInt8Block];
    for (int64_t b = 0; b < blocks_; ++b) {
      const int64_t lo = b * kInt8Block, len = std::min(kInt8Block, n_ - lo);
      for (int64_t i = lo; i < lo + len; ++i) g[i] += e[i];
      const float s = int8_encode_block(g + lo, len, q);
      for (int64_t i = 0; i < len; ++i) {
        e[lo + i] = g[lo + i] - float(q[i]) * s;
        codes[lo + i] = static_cast<unsigned char>(q[i]);
      }
      scales_[b] = s;
    }
    std::memset(codes + n_, 0, static_cast<size_t>(4 * (words_ - blocks_) - n_));  // padding of the last word
    std::memcpy(own, scales_.data(), sizeof(float) * static_cast<size_t>(blocks_));
    work_ = dp_.all_gather_async(gathered_.slice(dp_.rank() * words_, {words_}), gathered_);
  }

  // average = (sum over ranks r, in rank order, of code_r * scale_r) / p: the same operations on every rank.
  void complete() override {
    work_->wait();
    work_.reset();
    float* g = g_.data_as<float>();
    std::fill(g, g + n_, 0.0f);
    for (int r = 0; r < dp_.size(); ++r) {
      const int32_t* seg = gathered_.data_as<int32_t>() + r * words_;
      std::memcpy(scales_.data(), seg, sizeof(float) * static_cast<size_t>(blocks_));
      const unsigned char* codes = reinterpret_cast<const unsigned char*>(seg + blocks_);
      for (int64_t i = 0; i < n_; ++i) g[i] += float(static_cast<int8_t>(codes[i])) * scales_[i / kInt8Block];
    }
    const float p = float(dp_.size());
    for (int64_t i = 0; i < n_; ++i) g[i] /= p;
  }

  void reset() override { zero_(e_); }
  int64_t wire_bytes() const override { return 4 * words_; }
  int64_t buffer_bytes() const override { return static_cast<int64_t>(gathered_.nbytes()) + 4 * blocks_; }

 private:
  Communicator& dp_;
  Tensor g_, e_;
  int64_t n_, blocks_, words_;
  Tensor gathered_;  // I32, every rank's words_ in rank order; this rank's segment is the all_gather's input
  std::vector<float> scales_;
  WorkPtr work_;
};

}  // namespace

int64_t int8_wire_words(int64_t n) { return ceil_div(n, kInt8Block) + ceil_div(n, 4); }

float int8_encode_block(const float* x, int64_t len, int8_t* code) {
  float amax = 0;
  bool finite = true;
  for (int64_t i = 0; i < len; ++i) {
    const float a = std::fabs(x[i]);
    if (!(a <= std::numeric_limits<float>::max())) finite = false;  // inf or NaN
    else amax = std::max(amax, a);
  }
  for (int64_t i = 0; i < len; ++i) code[i] = 0;
  if (!finite) return std::numeric_limits<float>::quiet_NaN();
  const float scale = amax / 127.0f;
  if (!(scale > 0)) return 0.0f;  // all zero (or so tiny that the scale underflows: it stays in the residual)
  for (int64_t i = 0; i < len; ++i) {
    // |x / scale| <= 127 (1 + 2^-23), so the rounded code is within [-127, 127]; the clamp only guards that.
    const float q = std::nearbyint(x[i] / scale);
    code[i] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
  }
  return scale;
}

std::unique_ptr<BucketCompressor> make_int8_compressor(Communicator& dp, const Tensor& grads, const Tensor& residual) {
  return std::make_unique<Int8Compressor>(dp, grads, residual);
}

}  // namespace mt
