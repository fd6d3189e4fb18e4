// Loss scaling state machine (see loss_scaler.h).
#include "optim/loss_scaler.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "core/check.h"
#include "core/errors.h"

namespace mt {

LossScaler::LossScaler(const LossScalerSettings& s) : s_(s), scale_(s.init_scale) {
  MT_CHECK(s.init_scale > 0 && std::isfinite(s.init_scale) && s.growth_factor >= 1 && s.backoff_factor > 0 &&
               s.backoff_factor < 1 && s.growth_interval >= 1,
           "loss scaler: bad settings (scale {}, growth {}, backoff {}, interval {})", s.init_scale, s.growth_factor,
           s.backoff_factor, s.growth_interval);
}

LossScaler LossScaler::from_config(const std::string& loss_scale) {
  if (loss_scale == "dynamic") return LossScaler();
  char* end = nullptr;
  errno = 0;
  const double v = loss_scale.empty() ? 0 : std::strtod(loss_scale.c_str(), &end);
  if (loss_scale.empty() || end != loss_scale.c_str() + loss_scale.size() || errno == ERANGE || !std::isfinite(v) ||
      v <= 0)
    input_error("precision.loss_scale='{}' must be 'dynamic' or a positive number", loss_scale);
  LossScalerSettings s;
  s.dynamic = false;
  s.init_scale = v;
  return LossScaler(s);
}

bool LossScaler::update(bool overflow) {
  if (overflow) {
    ++skipped_;
    good_in_a_row_ = 0;
    if (s_.dynamic) scale_ *= s_.backoff_factor;
    return true;
  }
  if (s_.dynamic && ++good_in_a_row_ == s_.growth_interval) {
    scale_ *= s_.growth_factor;
    good_in_a_row_ = 0;
  }
  return false;
}

}  // namespace mt
