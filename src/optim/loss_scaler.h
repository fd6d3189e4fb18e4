// fp16 loss scaling, PyTorch GradScaler's rule. The loss's gradient is multiplied by scale() so that small
// gradients survive fp16; the optimizer divides it back out. An overflow is a non-finite global gradient norm
// (the norm is already reduced over the whole mesh, so every rank sees the same verdict and skips the same
// step). Dynamic scaling: on an overflow the step is skipped and the scale multiplied by backoff_factor; after
// growth_interval overflow-free steps in a row it is multiplied by growth_factor. A fixed scale
// (precision.loss_scale = a number) never changes, but overflowing steps are still skipped.
#pragma once
#include <cstdint>
#include <string>

namespace mt {

struct LossScalerSettings {
  bool dynamic = true;
  double init_scale = 65536.0;  // 2^16, as PyTorch
  double growth_factor = 2.0, backoff_factor = 0.5;
  int growth_interval = 2000;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerSettings& s = {});
  // precision.loss_scale: "dynamic" (default settings) or a positive number (a fixed scale). Throws InputError
  // otherwise.
  static LossScaler from_config(const std::string& loss_scale);

  double scale() const { return scale_; }
  // Records the step's outcome and adapts the scale; returns true when the step must be skipped.
  bool update(bool overflow);
  int64_t skipped_steps() const { return skipped_; }
  bool dynamic() const { return s_.dynamic; }
  // Checkpoints: the whole state (scale, clean steps in a row, skipped steps).
  int good_in_a_row() const { return good_in_a_row_; }
  void restore(double scale, int good_in_a_row, int64_t skipped) {
    scale_ = scale;
    good_in_a_row_ = good_in_a_row;
    skipped_ = skipped;
  }

 private:
  LossScalerSettings s_;
  double scale_;
  int good_in_a_row_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace mt
