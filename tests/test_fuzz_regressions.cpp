// Regression tests for the bugs the fuzzers and sanitizers found (docs/reliability.md, "Fuzzing and sanitizers").
// Each case is the (minimised) input that triggered the bug; under scripts/sanitize.sh the two integer overflows
// would abort with a UBSan report, in a normal build their messages carried wrapped numbers.
#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "core/errors.h"
#include "test_support.h"
#include "train/config.h"

using namespace mt;

namespace {

std::string write_config(const std::string& name, const std::string& text) {
  const std::string p = test::tmp_path("fuzz_regressions", name);
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

}  // namespace

TEST_CASE("config: a string value that is not UTF-8 is refused, since to_yaml would write U+FFFD in its place") {
  // fuzz_config: run.resume held the bytes E0 DF; to_yaml wrote them as two U+FFFD, so the resolved config.yaml
  // named another checkpoint path than the one the run used.
  const std::string bad = write_config("not_utf8.yaml", "run:\n  resume: auto \xE0\xDF\n");
  test::require_input_error([&] { load_config(bad, {}); }, {"run.resume", "not valid UTF-8"});
  Config c;
  test::require_input_error([&] { apply_override(c, "data.path=caf\xE9.bin"); }, {"data.path", "not valid UTF-8"});
  // Overlong forms and UTF-16 surrogates are not UTF-8 either.
  test::require_input_error([&] { apply_override(c, "run.dir=\xC0\xAF"); }, {"not valid UTF-8"});
  test::require_input_error([&] { apply_override(c, "run.dir=\xED\xA0\x80"); }, {"not valid UTF-8"});

  // Valid UTF-8 (2, 3 and 4-byte forms) is kept and survives the to_yaml round trip byte for byte.
  const std::string path = "caf\xC3\xA9/\xE2\x82\xAC/\xF0\x9F\x98\x80.bin";
  apply_override(c, "data.path=" + path);
  CHECK(c.data.path == path);
  const std::string again = write_config("utf8.yaml", to_yaml(c));
  CHECK(load_config(again, {}).data.path == path);
}

TEST_CASE("config: model.seq_len = INT_MAX is reported with seq_len+1 computed in 64 bits") {
  // UBSan: signed integer overflow in validate_values' message argument m.seq_len + 1.
  const std::string p = write_config("seq_len_max.yaml", "model: {seq_len: 2147483647}\n");
  test::require_input_error([&] { load_config(p, {}); }, {"model.seq_len+1=2147483648"});
}

TEST_CASE("validate: a dp*tp*pp product beyond 64 bits is reported exactly, not overflowed") {
  // UBSan: dp = tp = pp = 2^30 pass validate_values (tp divides n_head and 4*d_model, pp <= n_layer), and
  // (long long)dp * tp * pp overflowed in validate().
  const std::string p = write_config(
      "mesh_overflow.yaml",
      "model: {n_layer: 1073741824, n_head: 1073741824, d_model: 1073741824}\n"
      "parallel: {dp: 1073741824, tp: 1073741824, pp: 1073741824}\n");
  const Config c = load_config(p, {});
  test::require_input_error([&] { validate(c, 8); },
                            {"parallel.dp*tp*pp=1073741824*1073741824*1073741824=1237940039285380274899124224",
                             "does not equal the number of ranks (8)"});
}
