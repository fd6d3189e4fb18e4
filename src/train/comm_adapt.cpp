#include "train/comm_adapt.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/median.h"
#include "parallel/grad_buckets.h"

namespace mt {

namespace {

constexpr double kMiB = 1048576.0;

// The link a + c * bytes fitted by least squares to the window's operations (us, us per MiB). With one operation
// size only (no spread to separate the two), all of the time is put on the bytes, and it returns false: such a fit
// predicts other sizes badly, so it cannot tell a changed link either.
bool fit_link(const AdaptSample& w, double& alpha_us, double& beta_us_per_mb) {
  alpha_us = 0;
  beta_us_per_mb = w.sum_b > 0 ? w.sum_t / (w.sum_b / kMiB) : 0;
  const double n = w.ops, det = n * w.sum_bb - w.sum_b * w.sum_b;
  if (n < 2 || det <= 1e-9 * n * w.sum_bb) return false;
  const double c = (n * w.sum_bt - w.sum_b * w.sum_t) / det, a = (w.sum_t - c * w.sum_b) / n;
  if (c <= 0 || a < 0) return false;
  alpha_us = a;
  beta_us_per_mb = c * kMiB;
  return true;
}

void add(AdaptSample& w, const AdaptSample& s) {
  w.step_ms += s.step_ms;
  w.backward_ms += s.backward_ms;
  w.exposed_ms += s.exposed_ms;
  w.ops += s.ops;
  w.sum_b += s.sum_b;
  w.sum_t += s.sum_t;
  w.sum_bb += s.sum_bb;
  w.sum_bt += s.sum_bt;
}

}  // namespace

CommController::CommController(const AdaptLimits& limits, const AdaptSetting& start, double grad_mb,
                               std::vector<std::pair<CompressMethod, double>> wire_factors)
    : limits_(limits), current_(start), grad_mb_(grad_mb), factors_(std::move(wire_factors)) {}

double* CommController::measured_step(const AdaptSetting& s) {
  for (auto& m : measured_)
    if (m.first == s) return &m.second;
  return nullptr;
}

std::vector<double> bucket_ends_mb(double grad_mb, double bucket_mb) {
  std::vector<double> ends;
  const auto cut = [&](double from, double to, double size) {
    for (double x = from + size; x < to - 1e-9; x += size) ends.push_back(x);
    if (to > from + 1e-9) ends.push_back(to);
  };
  if (bucket_mb >= grad_mb - 1e-9) {
    ends.push_back(grad_mb);
  } else {
    const double head = std::min(bucket_mb, grad_mb - bucket_mb), tail = grad_mb - bucket_mb;
    cut(0, head, bucket_mb * kEdgeBucketShare);
    cut(head, tail, bucket_mb);
    cut(tail, grad_mb, bucket_mb * kEdgeBucketShare);
  }
  return ends;
}

double CommController::wire_factor(CompressMethod m) const {
  for (const auto& f : factors_)
    if (f.first == m) return f.second;
  return 1.0;
}

double CommController::predict_exposed_ms(const AdaptSetting& s, double alpha_us, double beta_us_per_mb,
                                          double backward_ms) const {
  const double factor = wire_factor(s.compress);
  double finish = 0, begin = 0;
  for (double end : bucket_ends_mb(grad_mb_, s.bucket_mb)) {
    const double ready = backward_ms * end / grad_mb_;
    finish = std::max(ready, finish) + (alpha_us + beta_us_per_mb * (end - begin) * factor) / 1000.0;
    begin = end;
  }
  return std::max(0.0, finish - backward_ms);
}

std::optional<AdaptDecision> CommController::observe(int step, const AdaptSample& s) {
  if (skip_ > 0) {
    --skip_;
    return std::nullopt;
  }
  window_rows_.push_back(s);
  // How the operations of the fitted setting compare with the last fit: their time over its prediction (1 where
  // there is no fit of this setting to compare with).
  const auto fit_ratio = [&](const AdaptSample& w) {
    if (!last_fit_ok_ || !(fit_setting_ == current_) || w.ops <= 0) return 1.0;
    const double expected = w.ops * last_alpha_ + last_beta_ * w.sum_b / kMiB;
    return expected > 0 ? w.sum_t / expected : 1.0;
  };
  const auto off = [](double ratio, double factor) { return ratio > factor || ratio < 1 / factor; };
  // A link that no longer matches the last fit starts a decision: its operations taking over twice or under half
  // the fit's prediction in two steps in a row (small operations are late now and then, when a communication thread
  // waits for its core), the two within 1.5x of each other (a stalled step followed by a slow one is no new link).
  const double ratio = fit_ratio(s);
  const bool link_changed = off(ratio, 2) && off(prev_ratio_, 2) &&
                            std::max(ratio, prev_ratio_) <= 1.5 * std::min(ratio, prev_ratio_);
  prev_ratio_ = ratio;
  const AdaptSample prev_step = prev_;
  prev_ = s;
  if (int(window_rows_.size()) < limits_.every && !link_changed) return std::nullopt;

  // On a changed link only the two steps that showed it describe the link (and the step) now. Otherwise the window
  // does, less its stalled steps (over twice its median step: something else on the machine held them up, and one
  // such step in the window's sums or means decided for all of it); the step's times are the medians of the rest.
  std::vector<AdaptSample> rows = link_changed ? std::vector<AdaptSample>{prev_step, s} : window_rows_;
  const auto middle = [&](double AdaptSample::*field) {
    std::vector<double> v;
    for (const AdaptSample& r : rows) v.push_back(r.*field);
    return median(std::move(v));
  };
  const double stalled_ms = 2 * middle(&AdaptSample::step_ms);
  rows.erase(std::remove_if(rows.begin(), rows.end(), [&](const AdaptSample& r) { return r.step_ms > stalled_ms; }),
             rows.end());
  AdaptSample w;
  for (const AdaptSample& r : rows) add(w, r);
  // Over a whole window a smaller change shows too: its operations taking over 1.5x or under 1/1.5 of the last
  // fit's prediction (more small buckets spread the change over more latencies, under the two steps' 2x).
  const bool drifted = !link_changed && off(fit_ratio(w), 1.5);
  AdaptDecision d;
  d.step = step + 1;
  d.from = current_;
  d.backward_ms = middle(&AdaptSample::backward_ms);
  d.step_ms = middle(&AdaptSample::step_ms);
  d.exposed_ms = middle(&AdaptSample::exposed_ms);
  last_fit_ok_ = fit_link(w, d.alpha_us, d.beta_us_per_mb);
  if (link_changed || drifted) {
    measured_.clear();
    optimism_ms_ = 0;
    d.why = "the link changed";
  }
  window_rows_.clear();
  prev_ratio_ = 1;
  last_alpha_ = d.alpha_us;
  last_beta_ = d.beta_us_per_mb;
  fit_setting_ = current_;
  // A setting tried on the model's word: how much less exposed time the model gave it than it had (its compute is
  // measured apart, per method). Later predictions for settings not yet measured carry that error, so the
  // model's optimism is not paid for twice. The model's expectation is taken again on this window's fit of the
  // link: what the earlier fit got wrong (one bucket of everything cannot tell the latency from the bytes) the
  // refit has corrected, and it is not the model's optimism.
  if (expected_missed_ms_ >= 0)
    optimism_ms_ = std::max(optimism_ms_, d.exposed_ms - expected_missed_ms_ -
                                              predict_exposed_ms(current_, d.alpha_us, d.beta_us_per_mb, d.backward_ms));
  expected_missed_ms_ = -1;
  // What this setting measured: its step, and the compute of its method (the step less the exposed time), which
  // carries a compression's own cost to the predictions of its other bucket sizes. Where it measured before on this
  // link, the change in its own step is the machine's (something else took cores for a while, or gave them back),
  // and the other settings' steps, measured at the machine's earlier speed, are scaled by it: unscaled, a slow spell
  // made the current setting look slower than one measured before it, and the controller went back to that.
  if (double* known = measured_step(current_)) {
    const double scale = *known > 0 ? d.step_ms / *known : 1.0;
    for (auto& m : measured_) m.second *= scale;
  } else {
    measured_.emplace_back(current_, d.step_ms);
  }
  compute_ms_[int(current_.compress)] = d.step_ms - d.exposed_ms;

  // Every candidate: bucket sizes in powers of two from the lower limit up to the first that holds the whole
  // gradient (or the upper limit), and the current size, times each allowed method. A candidate's step is what it
  // measured on this link, else its method's compute (a method not run yet: the uncompressed compute) plus the
  // exposed time the model predicts.
  std::vector<double> sizes = {current_.bucket_mb};
  for (double b = limits_.min_bucket_mb; b <= limits_.max_bucket_mb * (1 + 1e-9); b *= 2) {
    sizes.push_back(b);
    if (b >= grad_mb_) break;
  }
  // What the model misses of the current setting's exposed time (waits it does not see), added to its predictions.
  const double missed = std::max(0.0, d.exposed_ms - predict_exposed_ms(current_, d.alpha_us, d.beta_us_per_mb,
                                                                        d.backward_ms));
  auto step_of = [&](const AdaptSetting& c) {
    if (const double* known = measured_step(c)) return *known;
    double compute = compute_ms_[int(c.compress)];
    if (compute < 0) compute = compute_ms_[int(CompressMethod::None)];
    if (compute < 0) compute = d.step_ms - d.exposed_ms;
    return compute + missed + optimism_ms_ + predict_exposed_ms(c, d.alpha_us, d.beta_us_per_mb, d.backward_ms);
  };
  d.predicted_from_ms = d.step_ms;
  AdaptSetting best = current_;
  double best_ms = d.step_ms;
  for (CompressMethod m : limits_.methods)
    for (double b : sizes) {
      const AdaptSetting c{b, m};
      const double ms = step_of(c);
      // Ties go to the larger bucket (fewer operations) and the earlier method in the user's list.
      if (ms < best_ms - 1e-9 || (ms <= best_ms + 1e-9 && c.compress == best.compress && b > best.bucket_mb)) {
        best = c;
        best_ms = ms;
      }
    }
  d.predicted_to_ms = best_ms;
  // Hysteresis: a change must be worth 3% of the step.
  if (best == current_ || d.step_ms - best_ms <= 0.03 * d.step_ms) {
    if (!link_changed && !drifted) return std::nullopt;
    d.to = current_;  // reported: the link changed and the setting still fits it
    d.predicted_to_ms = d.step_ms;
    return d;
  }
  const bool measured = measured_step(best) != nullptr;
  if (d.why.empty()) d.why = measured ? "it measured faster steps on this link" : "the model predicts faster steps";
  d.to = best;
  current_ = best;
  if (!measured) expected_missed_ms_ = missed;
  skip_ = 1;
  prev_ = AdaptSample();  // the new setting's operations are not comparable with the old ones'
  return d;
}

}  // namespace mt
