// The fp16 loss scaler's state machine: growth after growth_interval good steps, back-off and a skipped step on
// every overflow, a fixed scale that never moves, and precision.loss_scale parsing.
#include <catch2/catch.hpp>

#include "core/errors.h"
#include "optim/loss_scaler.h"
#include "test_support.h"

using namespace mt;

TEST_CASE("dynamic loss scaling grows after an interval of good steps and backs off on overflow", "[loss_scaler]") {
  LossScalerSettings s;
  s.init_scale = 1024;
  s.growth_interval = 3;
  LossScaler ls(s);
  CHECK(!ls.update(false));
  CHECK(!ls.update(false));
  CHECK(ls.scale() == 1024);
  CHECK(!ls.update(false));  // third good step in a row: grow
  CHECK(ls.scale() == 2048);
  CHECK(!ls.update(false));
  CHECK(!ls.update(false));
  CHECK(ls.update(true));  // overflow: skip, back off, and the run of good steps starts again
  CHECK(ls.scale() == 1024);
  CHECK(ls.skipped_steps() == 1);
  CHECK(!ls.update(false));
  CHECK(!ls.update(false));
  CHECK(ls.scale() == 1024);  // only two good steps since the overflow
  CHECK(!ls.update(false));
  CHECK(ls.scale() == 2048);
  CHECK(ls.update(true));
  CHECK(ls.update(true));
  CHECK(ls.scale() == 512);
  CHECK(ls.skipped_steps() == 3);
}

TEST_CASE("a fixed loss scale never changes but still skips overflowing steps", "[loss_scaler]") {
  LossScaler ls = LossScaler::from_config("128");
  CHECK(!ls.dynamic());
  for (int i = 0; i < 5000; ++i) CHECK(!ls.update(false));
  CHECK(ls.update(true));
  CHECK(ls.scale() == 128);
  CHECK(ls.skipped_steps() == 1);
}

TEST_CASE("precision.loss_scale parses 'dynamic' or a positive number", "[loss_scaler]") {
  CHECK(LossScaler::from_config("dynamic").dynamic());
  CHECK(LossScaler::from_config("dynamic").scale() == 65536);
  CHECK(LossScaler::from_config("1e3").scale() == 1000);
  for (const char* bad : {"", "0", "-4", "abc", "inf", "nan", "1e999", "12x"}) {
    INFO(bad);
    test::require_input_error([&] { LossScaler::from_config(bad); }, {"precision.loss_scale", bad});
  }
}
