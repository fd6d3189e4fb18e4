// comm.adapt: a light controller that chooses the data-parallel gradient bucket size and, where the user allows
// it (comm.adapt_compress), the compression, from what each step measured (docs/adaptive.md). Every rank feeds it
// the same figures (the step's metrics, reduced over the ranks), so every rank decides alike and their buckets
// stay matched.
//
// Model. The last backward pass makes the gradient final at a steady rate (fraction x of the bytes after x of the
// pass); bucket i, of b bytes, is issued when its last byte is final and goes onto a serial link that takes
// a + c * wire_bytes (a fitted per operation, c per byte, from the step's all-reduces); its wire bytes are b times
// the method's wire factor. The exposed time of a setting is when the last bucket finishes minus the end of the
// pass. Each decision window (comm.adapt_every steps, less the steps stalled by something else on the machine: over
// twice its median step) refits a and c and gives every candidate (bucket sizes in powers of two between the
// limits, times the allowed methods) a step time: what it measured on this link (the window's median step) if it
// ran, else its method's measured compute (step less exposed time; a compression's own cost shows there) plus the
// exposed time the model predicts (plus what the model missed of the current setting's measured exposed time). It
// moves to the fastest when that beats the current setting's measured step by more than 3% (hysteresis). Measuring
// settles what the model gets wrong (the comm thread's work on the compute cores, a compression's cost), and once
// the model has been too optimistic about a setting, its predictions for the others carry that error. Two steps in
// a row whose operations take over twice or under half what the fit predicts for the same setting, and within 1.5x
// of each other, mean the link changed: the measurements are forgotten and a decision starts at once. Where the
// current setting measured before, its change is the machine's, and the other settings' measurements are scaled by it.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "parallel/compress_method.h"

namespace mt {

struct AdaptLimits {
  double min_bucket_mb = 0.25, max_bucket_mb = 64;
  std::vector<CompressMethod> methods;  // those it may choose (the run's own comm.compress among them)
  int every = 4;                        // steps per decision window
};

struct AdaptSetting {
  double bucket_mb = 25;
  CompressMethod compress = CompressMethod::None;
  bool operator==(const AdaptSetting& o) const { return bucket_mb == o.bucket_mb && compress == o.compress; }
};

// One step, as every rank sees it (maxima over ranks, sums over the step's gradient reductions).
struct AdaptSample {
  double step_ms = 0;
  double backward_ms = 0;  // the final backward pass: the window buckets can overlap
  double exposed_ms = 0;   // the slowest rank's compute waiting for communication
  // The step's gradient all-reduces: count, sum of wire bytes, of link time (us), of bytes^2 and of bytes x time.
  double ops = 0, sum_b = 0, sum_t = 0, sum_bb = 0, sum_bt = 0;
};

struct AdaptDecision {
  int step = 0;  // the first step with the new setting
  AdaptSetting from, to;
  double alpha_us = 0, beta_us_per_mb = 0;         // the fitted link
  double backward_ms = 0, step_ms = 0, exposed_ms = 0;  // the window's medians
  double predicted_from_ms = 0, predicted_to_ms = 0;     // step time: the current's measured, the new one's expected
  std::string why;
};

// The ends (MiB) of the buckets that cut grad_mb of gradients at bucket_mb, as make_buckets cuts them
// (parallel/grad_buckets.h) with the parameters' boundaries ignored: a quarter of the size within one bucket of
// either end when there is more than one bucket.
std::vector<double> bucket_ends_mb(double grad_mb, double bucket_mb);

class CommController {
 public:
  // grad_mb: the gradient buffer (fp32) the buckets cut; wire_factor(m): wire bytes per gradient byte of method m.
  CommController(const AdaptLimits& limits, const AdaptSetting& start, double grad_mb,
                 std::vector<std::pair<CompressMethod, double>> wire_factors);

  // Feeds step `step`'s figures; returns a decision, to apply from step + 1, when the setting should change, and
  // when the link changed (then `to` may equal `from`: the setting still fits).
  std::optional<AdaptDecision> observe(int step, const AdaptSample& s);

  const AdaptSetting& setting() const { return current_; }
  // The exposed time (ms) the model predicts for a setting, on link a + c * bytes, with a backward pass of Tb.
  double predict_exposed_ms(const AdaptSetting& s, double alpha_us, double beta_us_per_mb, double backward_ms) const;

 private:
  double wire_factor(CompressMethod m) const;
  double* measured_step(const AdaptSetting& s);  // its step time measured on this link, or null

  AdaptLimits limits_;
  AdaptSetting current_;
  double grad_mb_;
  std::vector<std::pair<CompressMethod, double>> factors_;
  std::vector<std::pair<AdaptSetting, double>> measured_;  // step time of each setting run on this link
  double expected_missed_ms_ = -1;   // the unmodelled exposed time expected of the unmeasured setting just chosen
  double optimism_ms_ = 0;           // the most such an expectation has undershot a measurement on this link
  // Per CompressMethod: its last measured compute (step less exposed time); -1 until it has run.
  std::vector<double> compute_ms_ = std::vector<double>(size_t(CompressMethod::PowerSGD) + 1, -1.0);
  std::vector<AdaptSample> window_rows_;   // the window's steps
  int skip_ = 1;                           // the first step on a new setting warms up: not counted
  AdaptSample prev_;                       // the step before this one
  double prev_ratio_ = 1;                  // its operations' time over the last fit's prediction
  double last_alpha_ = -1, last_beta_ = -1;  // the link at the last decision
  bool last_fit_ok_ = false;                 // fitted from operations of more than one size
  AdaptSetting fit_setting_;                 // the setting it was fitted on: other settings' operations differ (a
                                             // real operation's own overhead shows most in small ones)
};

}  // namespace mt
